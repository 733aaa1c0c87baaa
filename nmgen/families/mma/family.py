"""The tensor-core family: BF16 and FP16 values and activations on ``mma.sync`` m16n8k16,
FP32 accumulation, output in the input dtype (DESIGN §8)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...gpus import GpuSpec
from ...problem import Problem
from ...shapes import Shape
from ..tensor_core.config import DTYPES
from ..tensor_core.family import TensorCoreFamily
from ..tensor_core.model import RankTable
from . import model, render
from .config import FAMILY, MmaConfig
from .space import SPACE

SERVED_VECS = frozenset({16, 32, 64, 128, 256})
MAX_SERVED_M = 64  # window size m the family serves


class Mma(TensorCoreFamily):
    name = FAMILY
    title = "tensor cores (mma.sync, BF16/FP16)"
    dtypes = DTYPES
    space = SPACE
    subspaces = {"full": SPACE}
    config_type = MmaConfig
    template = render.TEMPLATE

    def serves(self, problem: Problem) -> str | None:
        refused = super().serves(problem)
        if refused is not None:
            return refused
        if problem.vec not in SERVED_VECS:
            return f"{FAMILY} kernels take L in {sorted(SERVED_VECS)}"
        if problem.m > MAX_SERVED_M:
            return f"{FAMILY} kernels take m <= {MAX_SERVED_M}"
        if problem.arch.number < 80:
            return f"{FAMILY} kernels need sm_80 or newer"
        return None

    def feasible(self, config: MmaConfig, gpu: GpuSpec) -> str | None:
        return model.feasible(config, gpu)

    def estimate_ms(self, config: MmaConfig, gpu: GpuSpec, shape: Shape) -> float:
        return model.estimate_ms(config, gpu, shape)

    def ranker(self, configs: Sequence[MmaConfig], gpu: GpuSpec) -> RankTable:
        return model.rank_table(configs, gpu)

    def seed_shape(self, config: MmaConfig) -> tuple:
        """Seeds differ in more than their pipeline depth."""
        return (config.bm, config.bn, config.windows, config.warps_m, config.warps_n)

    def template_arguments(self, config: MmaConfig) -> dict[str, Any]:
        return render.template_arguments(config)

    def entry_points(self, config: MmaConfig) -> tuple[str, ...]:
        return render.entry_points(config)


MMA = Mma()
