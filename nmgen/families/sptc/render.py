"""What the sparse-tensor-core template reads beside the configuration (part of the
family's generator hash, with the template)."""

from __future__ import annotations

from typing import Any

from ...gpus import SMEM_PER_SM
from ...problem import ALayout
from ..tensor_core import transpose
from .config import SptcConfig

TEMPLATE = "nm_sptc.cu.j2"
MAX_MIN_BLOCKS = 4
SMEM_RESERVED_PER_BLOCK = 1024


def min_blocks_per_sm(config: SptcConfig) -> int:
    """The ``__launch_bounds__`` occupancy hint: as many resident blocks as shared memory
    and the registers allow (at most ``MAX_MIN_BLOCKS``)."""
    smem_blocks = SMEM_PER_SM[config.arch.number] // (config.smem_bytes
                                                       + SMEM_RESERVED_PER_BLOCK)
    return max(1, min(MAX_MIN_BLOCKS, smem_blocks, config.blocks_by_registers()))


def template_arguments(config: SptcConfig) -> dict[str, Any]:
    """``copies_a``: the kernel that copies row-major A the bulk copy engine cannot address
    into a workspace; ``a_transposed``: the transpose of K-major A into row-major (the
    shared transpose, its rows and columns swapped); ``registers``: the setmaxnreg split."""
    min_blocks = min_blocks_per_sm(config)
    row_major = config.a_layout is ALayout.ROW_MAJOR
    return {"min_blocks": min_blocks, "mma_type": config.dtype.value,
            "acc_count": config.bn // 2, "registers": config.register_split(min_blocks),
            "copies_a": row_major, "a_transposed": not row_major,
            **transpose.template_arguments()}


def entry_points(config: SptcConfig) -> tuple[str, ...]:
    second = "_pad" if config.a_layout is ALayout.ROW_MAJOR else "_transpose"
    return (config.name, config.name + second)
