"""The ``mma.sp`` family (``mmasp``): weights whose kept elements fit the hardware's 2:4
(element-wise 2:4 checkpoints, 1:4, 1:2, 2:8, ... at any L) on ``mma.sp`` m16n8k32, every
GPU from sm_80, BF16 and FP16, FP32 accumulation (docs/design.md §12). Its weight layout is
the ``sptc`` family's (``nmgen.families.sparse24``)."""

from __future__ import annotations

from ...problem import Problem
from ..base import ModularFamily
from ..sparse24.prepare import worst_group_count
from .config import DTYPES, FAMILY, MmaSpConfig
from .space import SPACE


class MmaSp(ModularFamily):
    name = FAMILY
    title = "sparse tensor cores (mma.sp, 2:4, BF16/FP16, sm_80+)"
    dtypes = DTYPES
    space = SPACE
    subspaces = {"full": SPACE}
    config_type = MmaSpConfig
    base_package = "nmgen.families.sparse24"  # the weight layout, shared with sptc

    def serves(self, problem: Problem) -> str | None:
        """Patterns whose every weight fits 2:4 (at most two kept elements in each aligned
        group of four along K), any L, any arch nmgen knows (sm_80 and newer)."""
        refused = super().serves(problem)
        if refused is not None:
            return refused
        worst = worst_group_count(problem.n, problem.m)
        if worst > 2:
            return (f"{FAMILY} kernels take patterns whose kept elements fit 2:4; "
                    f"{problem.pattern} can keep {worst} of an aligned group of four")
        return None

    def seed_shape(self, config: MmaSpConfig) -> tuple:
        """Seeds differ in more than their pipeline depth."""
        return (config.bm, config.bn, config.warps_m, config.warps_n, config.split_k)


MMASP = MmaSp()
