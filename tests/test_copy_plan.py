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


def test_a_tx_copy_takes_16_byte_copies_at_any_m():
    """The "tx" copy's rows are padded with zeros to a multiple of 4: the main kernel reads
    it 16 bytes a copy at M = 777 too; the caller's own K-major A at M = 777 (rows 777
    floats apart) is read a float a copy."""
    import numpy as np

    import nmgen
    from nmgen.families.f32_simt import F32_SIMT
    from nmgen.families.plan import Call, Device, Scalar

    w = nmgen.prune(np.ones((256, 640), np.float32), "8:32", 32)
    device = Device(132, lambda entry, threads, smem: 1)
    name = "nm_spmm_f32_n8m32l32_ms64ns128ks128_mt16nt4_w4x8_nopack_s1_k1_{}_sm90"

    def a_vec4(layout: str, lda: int) -> int:
        config = nmgen.KernelConfig.from_name(name.format(layout))
        plan = F32_SIMT.plan(config, F32_SIMT.prepare(w, config), w.shape,
                             Call(777, lda, True), device)
        scalars = [a for a in plan.launches[-1].args if isinstance(a, Scalar)]
        return scalars[-1].value  # a_vec4, the main kernel's last scalar

    assert a_vec4("rm_tx", 256) == 1
    assert a_vec4("km", 777) == 0
    assert a_vec4("km", 780) == 0  # M itself is not a multiple of 4
