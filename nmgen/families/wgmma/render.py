"""What the wgmma template reads beside the configuration (part of the family's generator
hash, with the template)."""

from __future__ import annotations

from typing import Any

from ...gpus import SMEM_PER_SM
from ..tensor_core import transpose
from .config import WgmmaConfig

TEMPLATE = "nm_wgmma.cu.j2"
VECTOR_ELEMS = 8  # 16-bit elements of one 16-byte copy
MAX_MIN_BLOCKS = 2
SMEM_RESERVED_PER_BLOCK = 1024


def min_blocks_per_sm(config: WgmmaConfig) -> int:
    """The ``__launch_bounds__`` occupancy hint: as many resident blocks as the register
    estimate and shared memory allow (at most 2), so that ptxas budgets registers for it."""
    smem_blocks = SMEM_PER_SM[config.arch.number] // (config.smem_bytes
                                                       + SMEM_RESERVED_PER_BLOCK)
    return max(1, min(MAX_MIN_BLOCKS, smem_blocks, config.blocks_by_registers()))


def template_arguments(config: WgmmaConfig) -> dict[str, Any]:
    """``ws``: a producer warpgroup (producer "warp" or "tma"); ``tma``: its copies by the
    bulk copy engine; ``registers``: its ``setmaxnreg`` split (launch, producer, MMA
    registers a thread), or ``None`` where launch gives every thread enough."""
    min_blocks = min_blocks_per_sm(config)
    return {"min_blocks": min_blocks, "a_copied": config.a_copied,
            **transpose.template_arguments(),
            "mma_type": "bf16" if config.dtype.value == "bf16" else "f16",
            "acc_count": config.bn // 2, "ws": config.specialized, "tma": config.tma,
            "registers": config.register_split(min_blocks)}


def entry_points(config: WgmmaConfig) -> tuple[str, ...]:
    return (config.name, *([transpose.entry(config)] if config.a_copied else []))
