"""The Hopper tensor-core family: BF16 and FP16 values and activations on
``wgmma.mma_async`` (sm_90a), FP32 accumulation, output in the input dtype (DESIGN §8)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...gpus import Arch, GpuSpec
from ...problem import Problem
from ...shapes import Shape
from ..space import ConfigError, SearchSpace
from ..tensor_core.config import DTYPES
from ..tensor_core.family import TensorCoreFamily
from ..tensor_core.model import RankTable
from . import model, render
from .config import FAMILY, TARGET, Producer, WgmmaConfig
from .space import SPACE

SERVED_VECS = frozenset({64, 128, 256})  # multiples of the narrowest block (64 columns)
MAX_SERVED_M = 64  # window size m the family serves


class Wgmma(TensorCoreFamily):
    name = FAMILY
    title = "Hopper tensor cores (wgmma, BF16/FP16)"
    dtypes = DTYPES
    space = SPACE
    subspaces = {"full": SPACE}
    config_type = WgmmaConfig
    template = render.TEMPLATE

    def serves(self, problem: Problem) -> str | None:
        refused = super().serves(problem)
        if refused is not None:
            return refused
        if problem.arch is not Arch.SM90:
            return f"{FAMILY} kernels need sm_90 (wgmma)"
        if problem.vec not in SERVED_VECS:
            return f"{FAMILY} kernels take L in {sorted(SERVED_VECS)}"
        if problem.m > MAX_SERVED_M:
            return f"{FAMILY} kernels take m <= {MAX_SERVED_M}"
        return None

    def compile_target(self, config: WgmmaConfig) -> str:
        return TARGET

    def feasible(self, config: WgmmaConfig, gpu: GpuSpec) -> str | None:
        return model.feasible(config, gpu)

    def estimate_ms(self, config: WgmmaConfig, gpu: GpuSpec, shape: Shape) -> float:
        return model.estimate_ms(config, gpu, shape)

    def ranker(self, configs: Sequence[WgmmaConfig], gpu: GpuSpec) -> RankTable:
        return model.rank_table(configs, gpu)

    def seed_candidates(self, problem: Problem, space: SearchSpace) -> list[WgmmaConfig]:
        """The space's configurations but the bulk-copy producers: the model does not tell
        one from its ``_ws`` twin, which the seeds and dispatch keep until a record says
        otherwise."""
        return [c for c in super().seed_candidates(problem, space) if not c.tma]

    def refinements(self, config: WgmmaConfig) -> list[WgmmaConfig]:
        """A ``_ws`` winner's twin whose producer copies by the bulk copy engine."""
        if config.producer is not Producer.WARP:
            return []
        try:
            return [config.replace(producer=Producer.TMA)]
        except ConfigError:
            return []

    def seed_shape(self, config: WgmmaConfig) -> tuple:
        """Seeds differ in more than their pipeline depth."""
        return (config.bm, config.bn, config.windows, config.warpgroups)

    def template_arguments(self, config: WgmmaConfig) -> dict[str, Any]:
        return render.template_arguments(config)

    def entry_points(self, config: WgmmaConfig) -> tuple[str, ...]:
        return render.entry_points(config)


WGMMA = Wgmma()
