"""What the FP32 SIMT template reads beside the configuration: unrolls, the occupancy hint
and the transpose kernel's tile. Part of the family's generator hash (with the template),
so a change here re-keys the tuned records (``nmgen carry``)."""

from __future__ import annotations

from typing import Any

from ...problem import ALayout
from .config import ATile, KernelConfig
from .model import min_blocks_per_sm

TEMPLATE = "nm_spmm_f32.cu.j2"
# The compute loop over a stage's compressed rows is unrolled by at most ROW_UNROLL: on an
# H100 the K-major core kernels are fastest so (full unroll 1-3 % slower at 32 and 48 rows,
# by 8 or 4 slower still; docs/engineering-notes.md), and nvcc takes less time than
# unrolled fully.
ROW_UNROLL = 16
COPY_UNROLL = 8  # the stage-copy loops' unroll where it divides their trip counts
# The transpose kernel of a copied A tile ("tx") moves COPY_A_TILE x COPY_A_TILE floats a
# block of COPY_A_THREADS threads; the template and the launch plan both take them from here.
COPY_A_TILE = 64
COPY_A_THREADS = 256


def row_unroll(config: KernelConfig) -> int:
    """How far the compute loop over a stage's ``ws`` compressed rows is unrolled."""
    return min(config.ws // config.slice_k, ROW_UNROLL)


def copy_trip_counts(config: KernelConfig) -> list[int]:
    """Rows a thread steps through in the stage copies that keep one chunk column a
    thread (``for_each_cell`` / ``for_each_chunk_at``): B' and the A tile."""
    tiles = [(config.ws, config.ns // 4)]  # B': WS rows of NS/4 chunks
    if config.a_tile is ATile.M_MAJOR:
        tiles.append((config.ms, config.ks // 4))
    elif config.landing and not config.swizzle:  # chunk pairs x 2 lanes a landing row
        tiles.append(((-(-config.a_rows // 4) + 1) // 2, 2 * config.ms))
    elif not config.staged:
        tiles.append((config.a_rows, config.ms // 4))
    return [-(-rows // (config.threads // chunks)) for rows, chunks in tiles
            if config.threads % chunks == 0]


def copy_unroll(config: KernelConfig) -> int:
    """The copy loops' unroll: COPY_UNROLL, or all of the longest copy loop where a trip
    count above COPY_UNROLL is not a multiple of it (12 steps unrolled by 8 left a
    remainder loop that cost the 12:32 core kernel 2.7 %)."""
    trips = copy_trip_counts(config)
    if any(n > COPY_UNROLL and n % COPY_UNROLL for n in trips):
        return max(trips)
    return COPY_UNROLL


def serpentine_ffma(config: KernelConfig) -> bool:
    """Whether odd thread-tile rows walk their columns backwards in the FFMA loop. It
    pays on 8x8 thread tiles (+1.2 to +3.6 % on all five 8x8 tuned winners timed) and
    costs 0.7-2.7 % on 16x8 ones."""
    return config.mt == 8 and config.nt == 8


def template_arguments(config: KernelConfig) -> dict[str, Any]:
    return {
        "row_major": config.kernel_a_layout is ALayout.ROW_MAJOR,
        "m_major_tile": config.a_tile is ATile.M_MAJOR,
        "unroll_w": row_unroll(config),
        "copy_unroll": copy_unroll(config),
        "serpentine": serpentine_ffma(config),
        "min_blocks": min_blocks_per_sm(config),
        "copy_tile": COPY_A_TILE,
        "copy_threads": COPY_A_THREADS,
        "pos_t": "int" if config.table_bytes == 4 else "unsigned short",
    }


def entry_points(config: KernelConfig) -> tuple[str, ...]:
    """The main kernel, then the split-K reduction and A's transpose where present."""
    extra = (["_reduce"] if config.split_k > 1 else []) + (
        ["_transpose"] if config.a_copied else [])
    return (config.name, *(config.name + suffix for suffix in extra))
