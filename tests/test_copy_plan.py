"""How a copied-A (tx) launch is cut into pipelined chunks (nmgen.copy_plan): host only."""

from nmgen.families.f32_simt.copy_plan import copy_chunk_rows, copy_chunks, pipelined


def test_copy_chunks_are_whole_waves_of_enough_rows_and_bytes():
    # The H100 core kernels at 4096^3: 16 blocks a block row, 264 slots: 16 rows a wave.
    assert copy_chunk_rows(4096, 64, 16, 264) == 1024
    assert copy_chunk_rows(2048, 64, 16, 264) == 1024  # 8 MiB of A a chunk
    assert copy_chunk_rows(2000, 64, 16, 264) == 0  # less: no pipeline
    # A wave of 6 block rows (43 blocks a row) is under the minimum rows: two waves a chunk.
    assert copy_chunk_rows(4096, 64, 43, 264) == 768
    # A block row wider than the GPU: no whole wave, no pipeline.
    assert copy_chunk_rows(4096, 64, 300, 264) == 0
    assert copy_chunks(4096, 1024) == [1024] * 4
    assert copy_chunks(4096 + 512, 1024) == [1024] * 4 + [512]  # half a chunk
    assert copy_chunks(4096 + 37, 1024) == [4133]  # a short last chunk: no
    assert copy_chunks(3071, 1024) == [3071]  # under three chunks: one copy
    assert copy_chunks(4096, 0) == [4096]


def test_pipelined_takes_arrays_as_the_model_does():
    import numpy as np

    rows = copy_chunk_rows(np.array([4096, 2000, 4096]), 64, np.array([16, 16, 300]), 264)
    assert rows.tolist() == [1024, 0, 0]
    assert pipelined(4096, rows).tolist() == [True, False, False]
