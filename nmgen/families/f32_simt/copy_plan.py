"""How a launch that copies row-major A K-major first (``tx``) is cut into pipelined chunks
of M: the family's launch plan (``launch``) cuts it, its model (``model``) prices it.

Chunk j's copy then overlaps chunk j-1's main kernel (H100 at 4096^3: 1.03 of K-major A at
8:32 instead of 1.06, 1.08 instead of 1.12 at 4:32). The limits come from timing the
pipelined launch against one copy on the 118 tuned row-major problems that it applied to
first (docs/engineering-notes.md §6): chunks too short for the overlap to pay for
their boundaries, or a short last chunk, lost up to 6 %. Scalars or NumPy arrays alike.
"""

from __future__ import annotations

import numpy as np

PIPELINE_MIN_CHUNKS = 3
PIPELINE_MIN_ROWS = 512
PIPELINE_MIN_CHUNK_BYTES = 8 << 20  # of A a chunk's copy reads


def copy_chunk_rows(k_dim, ms, grid_x, slots):
    """Rows of a chunk, 0 where none pays: a whole number of waves (``slots`` resident
    blocks over ``grid_x`` blocks a block row), at least ``PIPELINE_MIN_ROWS`` rows and
    ``PIPELINE_MIN_CHUNK_BYTES`` of A."""
    wave_rows = slots // grid_x * ms
    rows = wave_rows * -(-PIPELINE_MIN_ROWS // np.maximum(wave_rows, 1))
    return np.where((wave_rows > 0) & (4 * rows * k_dim >= PIPELINE_MIN_CHUNK_BYTES), rows, 0)


def pipelined(m_rows, rows):
    """Whether ``m_rows`` rows are cut in chunks of ``rows``: at least
    ``PIPELINE_MIN_CHUNKS`` of them, and the remainder, a chunk of its own, at least half a
    chunk (a shorter one is a partial wave that nothing overlaps)."""
    rest = m_rows % np.maximum(rows, 1)
    return (rows > 0) & (m_rows >= PIPELINE_MIN_CHUNKS * rows) & ~((rest > 0) & (2 * rest < rows))


def copy_chunks(m_rows: int, rows: int) -> list[int]:
    """The rows of each chunk (``[m_rows]``: not pipelined)."""
    if not pipelined(m_rows, rows):
        return [m_rows]
    whole, rest = divmod(m_rows, rows)
    return [rows] * whole + ([rest] if rest else [])
