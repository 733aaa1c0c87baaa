"""What the tensor-core template reads beside the configuration (part of the family's
generator hash, with the template)."""

from __future__ import annotations

from typing import Any

from ...gpus import REGISTERS_PER_SM, SMEM_PER_SM
from ..tensor_core import transpose
from .config import MmaConfig

TEMPLATE = "nm_mma.cu.j2"
VECTOR_ELEMS = 8  # 16-bit elements of one 16-byte copy
MAX_MIN_BLOCKS = 4
SMEM_RESERVED_PER_BLOCK = 1024


def min_blocks_per_sm(config: MmaConfig) -> int:
    """The ``__launch_bounds__`` occupancy hint: as many resident blocks as the register
    estimate and shared memory allow (at most 4), so that ptxas budgets registers for it."""
    smem_blocks = SMEM_PER_SM[config.arch.number] // (config.smem_bytes
                                                       + SMEM_RESERVED_PER_BLOCK)
    reg_blocks = REGISTERS_PER_SM // (config.threads * config.registers_estimate)
    return max(1, min(MAX_MIN_BLOCKS, smem_blocks, reg_blocks))


def template_arguments(config: MmaConfig) -> dict[str, Any]:
    return {"row_major": config.gathers_windows, "a_copied": config.a_copied,
            **transpose.template_arguments(), "min_blocks": min_blocks_per_sm(config),
            "mma_type": "bf16" if config.dtype.value == "bf16" else "f16"}


def entry_points(config: MmaConfig) -> tuple[str, ...]:
    return (config.name, *([transpose.entry(config)] if config.a_copied else []))
