"""The Hopper tensor-core family: BF16 and FP16 values and activations on
``wgmma.mma_async`` (sm_90a), FP32 accumulation, output in the input dtype (docs/design.md §8)."""

from __future__ import annotations

from ...gpus import Arch
from ...problem import Problem
from ..space import ConfigError, SearchSpace
from ..tensor_core.family import TensorCoreFamily
from .config import FAMILY, TARGET, Producer, WgmmaConfig
from .space import SPACE


class Wgmma(TensorCoreFamily):
    name = FAMILY
    title = "Hopper tensor cores (wgmma, BF16/FP16)"
    space = SPACE
    subspaces = {"full": SPACE}
    config_type = WgmmaConfig
    served_vecs = frozenset({64, 128, 256})  # multiples of the narrowest block (64 columns)
    archs = frozenset({Arch.SM90})
    archs_named = "sm_90 (wgmma)"

    def compile_target(self, config: WgmmaConfig) -> str:
        return TARGET

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


WGMMA = Wgmma()
