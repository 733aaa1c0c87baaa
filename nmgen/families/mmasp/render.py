"""What the ``mma.sp`` template reads beside the configuration (part of the family's
generator hash, with the template)."""

from __future__ import annotations

from typing import Any

from ...gpus import SMEM_PER_SM
from ...problem import ALayout
from .config import MmaSpConfig

TEMPLATE = "nm_mmasp.cu.j2"
MAX_MIN_BLOCKS = 4
SMEM_RESERVED_PER_BLOCK = 1024


def min_blocks_per_sm(config: MmaSpConfig) -> int:
    """The ``__launch_bounds__`` occupancy hint: as many resident blocks as shared memory
    and the registers (by the estimate) allow, at most ``MAX_MIN_BLOCKS``. Without one,
    ptxas chose its own register limit and spilled below it (96 registers, b256x8)."""
    smem_blocks = SMEM_PER_SM[config.arch.number] // (config.smem_bytes
                                                       + SMEM_RESERVED_PER_BLOCK)
    return max(1, min(MAX_MIN_BLOCKS, smem_blocks, config.blocks_by_registers()))


def template_arguments(config: MmaSpConfig) -> dict[str, Any]:
    """``row_major``: A's layout where cp.async cannot read it in chunks (read element by
    element along its contiguous dimension)."""
    return {"mma_type": config.dtype.value, "min_blocks": min_blocks_per_sm(config),
            "row_major": config.a_layout is ALayout.ROW_MAJOR}


def entry_points(config: MmaSpConfig) -> tuple[str, ...]:
    return (config.name,)
