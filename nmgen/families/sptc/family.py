"""The sparse-tensor-core family (``sptc``): weights whose kept elements fit the hardware's
2:4 (element-wise 2:4 checkpoints, 1:4, 1:2, 2:8, ... at any L) on
``wgmma.mma_async.sp`` (sm_90a), BF16 and FP16, FP32 accumulation (docs/design.md §12)."""

from __future__ import annotations

from ...gpus import Arch
from ...problem import Problem
from ..base import DEVICE_TEMPLATE, EPILOGUE_TEMPLATE, TRANSPOSE_TEMPLATE, ModularFamily
from ..sparse24.prepare import worst_group_count
from .config import DTYPES, FAMILY, TARGET, SptcConfig
from .space import SPACE


class Sptc(ModularFamily):
    name = FAMILY
    title = "Hopper sparse tensor cores (wgmma.sp, 2:4, BF16/FP16)"
    dtypes = DTYPES
    space = SPACE
    subspaces = {"full": SPACE}
    config_type = SptcConfig
    base_package = "nmgen.families.sparse24"  # the weight layout, shared with mmasp
    shared_templates = (EPILOGUE_TEMPLATE, DEVICE_TEMPLATE, TRANSPOSE_TEMPLATE)

    def serves(self, problem: Problem) -> str | None:
        """Patterns whose every weight fits 2:4 (at most two kept elements in each aligned
        group of four along K: 2:4, 1:4, 1:2, 2:8, ...), any L, on sm_90."""
        refused = super().serves(problem)
        if refused is not None:
            return refused
        if problem.arch is not Arch.SM90:
            return f"{FAMILY} kernels need sm_90 (wgmma.mma_async.sp)"
        worst = worst_group_count(problem.n, problem.m)
        if worst > 2:
            return (f"{FAMILY} kernels take patterns whose kept elements fit 2:4; "
                    f"{problem.pattern} can keep {worst} of an aligned group of four")
        return None

    def compile_target(self, config: SptcConfig) -> str:
        return TARGET

    def seed_shape(self, config: SptcConfig) -> tuple:
        """Seeds differ in more than their pipeline depth."""
        return (config.bm, config.bn, config.warpgroups, config.split_k)


SPTC = Sptc()
