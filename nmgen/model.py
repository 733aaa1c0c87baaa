"""The analytic model (DESIGN §3): resources a configuration needs on its architecture.

This first part holds what code generation needs (register estimate, blocks per SM);
the performance estimates that guide the tuner build on it.
"""

from __future__ import annotations

from .config import REGISTERS_PER_SM, Arch, KernelConfig

MAX_BLOCKS_PER_SM = 32
SMEM_PER_SM = {80: 164 * 1024, 86: 100 * 1024, 89: 100 * 1024, 90: 228 * 1024}
# Reserved by the driver per resident block (CUDA occupancy calculator).
SMEM_RESERVED_PER_BLOCK = 1024


def smem_blocks_per_sm(config: KernelConfig) -> int:
    per_block = config.smem_bytes + SMEM_RESERVED_PER_BLOCK
    return SMEM_PER_SM[config.arch.number] // per_block


def min_blocks_per_sm(config: KernelConfig) -> int:
    """The ``__launch_bounds__`` occupancy hint: as many resident blocks as the register
    estimate and shared memory allow (at most 4), so that ptxas budgets registers for it."""
    regs = config.registers_estimate
    best = 1
    for blocks in (2, 3, 4):
        fits_regs = REGISTERS_PER_SM // (config.threads * blocks) >= regs
        if fits_regs and blocks <= smem_blocks_per_sm(config):
            best = blocks
    return best


def arch_of_capability(major: int, minor: int) -> Arch:
    """The nearest supported compile target at or below a compute capability."""
    number = major * 10 + minor
    supported = sorted((a for a in Arch if a.number <= number), key=lambda a: a.number)
    if not supported:
        raise ValueError(f"compute capability {major}.{minor}: nmgen needs sm_80 or newer")
    return supported[-1]
