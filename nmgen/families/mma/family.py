"""The tensor-core family: BF16 and FP16 values and activations on ``mma.sync`` m16n8k16,
FP32 accumulation, output in the input dtype (docs/design.md §8)."""

from __future__ import annotations

from ...gpus import Arch
from ..tensor_core.family import TensorCoreFamily
from .config import FAMILY, MmaConfig
from .space import SPACE


class Mma(TensorCoreFamily):
    name = FAMILY
    title = "tensor cores (mma.sync, BF16/FP16)"
    space = SPACE
    subspaces = {"full": SPACE}
    config_type = MmaConfig
    served_vecs = frozenset({16, 32, 64, 128, 256})
    archs = frozenset(a for a in Arch if a.number >= 80)
    archs_named = "sm_80 or newer"

    def seed_shape(self, config: MmaConfig) -> tuple:
        """Seeds differ in more than their pipeline depth."""
        return (config.bm, config.bn, config.windows, config.warps_m, config.warps_n)


MMA = Mma()
