"""The ``mma.sp`` family (``mmasp``): weights whose kept elements fit the hardware's 2:4
(element-wise 2:4 checkpoints, 1:4, 1:2, 2:8, ... at any L) on ``mma.sp`` m16n8k32, every
GPU from sm_80, BF16 and FP16, FP32 accumulation (docs/design.md §12). Its weight layout is
the ``sptc`` family's (``nmgen.families.sparse24``). Dispatch and the tuner use it where
``sptc`` cannot run (sm_80 to sm_89): on an H200 it ran 1.4-3.3x slower than ``sptc`` on
every element-wise 2:4 shape timed, M = 1 to 2048 (``results/mmasp_h200/``)."""

from __future__ import annotations

from ...gpus import Arch
from ...problem import Problem
from ..base import DEVICE_TEMPLATE, EPILOGUE_TEMPLATE, ModularFamily
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
    shared_templates = (EPILOGUE_TEMPLATE, DEVICE_TEMPLATE)

    def serves(self, problem: Problem) -> str | None:
        """Patterns whose every weight fits 2:4 (at most two kept elements in each aligned
        group of four along K), any L, on the archs without ``wgmma.sp`` (below sm_90;
        its kernels are named for sm_80 and run on any later GPU)."""
        refused = super().serves(problem)
        if refused is not None:
            return refused
        if problem.arch is Arch.SM90:
            return (f"{FAMILY} kernels serve GPUs below sm_90: on sm_90 the sptc family "
                    "(wgmma.sp) runs the same weights faster")
        worst = worst_group_count(problem.n, problem.m)
        if worst > 2:
            return (f"{FAMILY} kernels take patterns whose kept elements fit 2:4; "
                    f"{problem.pattern} can keep {worst} of an aligned group of four")
        return None

    def seed_shape(self, config: MmaSpConfig) -> tuple:
        """Seeds differ in more than their pipeline depth."""
        return (config.bm, config.bn, config.warps_m, config.warps_n, config.split_k)


MMASP = MmaSp()
