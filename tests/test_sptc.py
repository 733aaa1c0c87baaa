"""The sparse-tensor-core family (sptc: wgmma.mma_async.sp, 2:4) on the CPU: names and rules,
the patterns it serves, the weight layout (values and metadata read back as the MMA's
threads read them), the refusal of weights that do not fit 2:4, the launch plan, the model
and the space; nvcc builds named configurations for sm_90a without spills or wgmma
serialization."""

from __future__ import annotations

import numpy as np
import pytest

import nmgen
from nmgen.families.plan import Call, Device, TensorMap2D
from nmgen.families.registry import config_from_dict, config_from_name, serving
from nmgen.families.sparse24.prepare import STAGE_K, prepare, worst_group_count
from nmgen.families.sptc import SPTC
from nmgen.families.sptc.config import SptcConfig
from nmgen.families.sptc.launch import A_COPY, SPLIT_SUMS, TILE_COUNTERS, slicing
from nmgen.families.sptc.render import min_blocks_per_sm
from nmgen.format import DType, NMMatrix
from nmgen.gpus import REGISTERS_PER_SM, Arch, gpu_spec
from nmgen.problem import Problem
from nmgen.runtime.check import random_weight

H100 = gpu_spec("h100")
CONFIG = SptcConfig(2, 4, 1, bm=128, bn=128, warpgroups=2, stages=4)
DEVICE = Device(132, lambda entry, threads, smem: 1)


def test_name_states_every_parameter_and_round_trips():
    assert CONFIG.name == "nm_sptc_bf16_n2m4l1_b128x128x128_g2_s4_k1_rm_sm90a"
    assert SptcConfig.from_name(CONFIG.name) == CONFIG
    assert config_from_name(CONFIG.name) == CONFIG
    assert config_from_dict(CONFIG.to_dict()) == CONFIG
    other = CONFIG.replace(dtype="f16", bn=8, bm=64, warpgroups=1, split_k=4,
                           a_layout="km", epilogue="bias_gelu")
    assert other.name == "nm_sptc_f16_n2m4l1_b64x8x128_g1_s4_k4_km_sm90a_bias_gelu"
    assert config_from_name(other.name) == other
    with pytest.raises(nmgen.ConfigError, match="not a sptc kernel name"):
        SptcConfig.from_name("nm_sptc_bf16_n2m4l1_b128x128x128_g2_s4_rm_sm90a")


@pytest.mark.parametrize(("n", "m", "worst"), [(2, 4, 2), (1, 4, 1), (1, 2, 2), (2, 8, 2),
                                               (4, 8, 4), (16, 32, 4), (1, 3, 2), (2, 3, 4),
                                               (3, 8, 3)])
def test_the_most_kept_in_an_aligned_group_of_four(n, m, worst):
    assert worst_group_count(n, m) == worst


def test_serves_patterns_that_always_fit_2of4_at_any_vector_length():
    for n, m, vec in [(2, 4, 1), (1, 4, 1), (1, 2, 1), (2, 8, 16), (2, 4, 128), (1, 3, 1)]:
        assert SPTC.serves(Problem(n, m, vec, dtype="bf16")) is None, (n, m, vec)
        assert SPTC in serving(Problem(n, m, vec, dtype="f16"))
    assert "fit 2:4" in SPTC.serves(Problem(4, 8, 1, dtype="bf16"))
    assert "fit 2:4" in SPTC.serves(Problem(8, 32, 128, dtype="bf16"))
    assert "take bf16, f16" in SPTC.serves(Problem(2, 4, 1, dtype="f32"))
    assert "sm_90" in SPTC.serves(Problem(2, 4, 1, arch=Arch.SM80, dtype="bf16"))


def test_rules_name_what_breaks():
    with pytest.raises(nmgen.ConfigError, match="bm = 64 \\* tiles_m"):
        CONFIG.replace(bm=64, warpgroups=2)
    with pytest.raises(nmgen.ConfigError, match="shared memory"):
        CONFIG.replace(bn=256, stages=8)
    with pytest.raises(nmgen.ConfigError, match="n/m <= 1/2"):
        CONFIG.replace(n=3, m=4)
    with pytest.raises(nmgen.ConfigError, match="bn in"):
        CONFIG.replace(bn=24)


def read_back(prepared, depth: int, cols: int) -> np.ndarray:
    """The dense ``K×N`` weight as wgmma.mma_async.sp reads the layout: thread (warp w,
    lane 4g + t), t in {0, 1}, of m64 tile T gives rows 64T + 16w + g (low half-word) and
    + 8 (high) the positions of four groups of four of K 16t .. 16t + 15 of each k32 step;
    a row's kept values are its stage's 64 values in K order."""
    values = prepared.arrays["values"].astype(np.float64)
    meta = prepared.arrays["meta"]
    rows, kept_k = values.shape
    stages = kept_k * 2 // STAGE_K
    dense = np.zeros((rows, stages * STAGE_K))
    words = meta.reshape(stages, rows // 64, 4, 8, 2, 4)  # [S][T][w][g][t][step]
    for s, tile, w, g, t, step in np.ndindex(words.shape):
        word = int(words[s, tile, w, g, t, step])
        for half, row in ((0, tile * 64 + 16 * w + g), (1, tile * 64 + 16 * w + g + 8)):
            bits = (word >> (16 * half)) & 0xFFFF
            for q in range(4):
                group = s * 32 + step * 8 + 4 * t + q  # group of four along K
                nibble = (bits >> (4 * q)) & 0xF
                i0, i1 = nibble & 3, nibble >> 2
                assert i0 < i1, "metadata positions distinct and ascending"
                dense[row, group * 4 + i0] += values[row, group * 2]
                dense[row, group * 4 + i1] += values[row, group * 2 + 1]
    return dense[:cols, :depth].T


@pytest.mark.parametrize(("n", "m", "vec", "depth", "cols"),
                         [(2, 4, 1, 300, 70), (1, 4, 1, 129, 5), (2, 8, 16, 256, 64),
                          (1, 2, 1, 3, 1), (2, 4, 128, 515, 130)])
def test_the_layout_read_as_the_mma_reads_it_is_the_weight(n, m, vec, depth, cols):
    rng = np.random.default_rng(n * 1000 + depth)
    weight = random_weight(rng, n, m, vec, depth, cols, dtype=DType.BF16)
    config = SptcConfig(n, m, vec, bm=64, bn=8, warpgroups=1, stages=2)
    prepared = prepare(weight, config)
    assert prepared.arrays["values"].shape[0] % 256 == 0
    np.testing.assert_array_equal(read_back(prepared, depth, cols),
                                  weight.to_dense().astype(np.float64))


def test_a_weight_with_three_non_zeros_in_a_group_is_refused_naming_it():
    dense = np.zeros((8, 3), np.float32)
    dense[4:7, 1] = 1.0  # three of rows 4-7 in column 1
    weight = nmgen.prune(dense, "4:8", vec=1, dtype="bf16")
    config = SptcConfig(4, 8, 1, bm=64, bn=8, warpgroups=1, stages=2)
    with pytest.raises(ValueError, match="column 1 holds 3 in rows 4-7"):
        prepare(weight, config)


def test_negative_zero_counts_as_zero_and_kept_values_stay_exact():
    """A 4:8 weight whose first group of four keeps three rows, one of them -0.0: two
    non-zero elements, so it fits 2:4 and reads back exactly."""
    import ml_dtypes

    values = np.array([[1.0], [2.0], [-0.0], [3.0]], ml_dtypes.bfloat16)
    weight = NMMatrix.from_compressed(values, np.array([[0], [1], [2], [4]]), "4:8", 1, (8, 1))
    config = SptcConfig(4, 8, 1, bm=64, bn=8, warpgroups=1, stages=2)
    prepared = prepare(weight, config)
    np.testing.assert_array_equal(read_back(prepared, 8, 1),
                                  weight.to_dense().astype(np.float64))
    three = NMMatrix.from_compressed(values.astype(np.float32) + 1, np.array([[0], [1], [2], [4]]),
                                     "4:8", 1, (8, 1), dtype="bf16")
    with pytest.raises(ValueError, match="column 0 holds 3 in rows 0-3"):
        prepare(three, config)


def test_the_launch_reads_a_by_tensor_map_or_copies_it_first():
    rng = np.random.default_rng(1)
    weight = random_weight(rng, 2, 4, 1, 1000, 300, dtype=DType.BF16)
    prepared = prepare(weight, CONFIG)
    direct = SPTC.plan(CONFIG, prepared, weight.shape, Call(50, 1000, True), DEVICE)
    assert [launch.entry for launch in direct.launches] == [CONFIG.name]
    main = direct.launches[0]
    assert main.grid == (3, 1, 1) and main.threads == 384 and main.smem == CONFIG.smem_bytes
    maps = [arg for arg in main.args if isinstance(arg, TensorMap2D)]
    assert [m.buffer for m in maps] == ["values", "a"]
    assert maps[1].box == (64, 128) and maps[1].cols == 1000 and maps[1].rows == 50
    unaligned = SPTC.plan(CONFIG, prepared, weight.shape, Call(50, 1003, True), DEVICE)
    assert [launch.entry for launch in unaligned.launches] == [CONFIG.name + "_pad",
                                                              CONFIG.name]
    assert unaligned.workspaces[0].name == A_COPY
    k_major = CONFIG.replace(a_layout="km")
    transposed = SPTC.plan(k_major, prepare(weight, k_major), weight.shape,
                           Call(50, 64, True), DEVICE)
    assert transposed.launches[0].entry == k_major.name + "_transpose"
    assert [m.buffer for m in transposed.launches[1].args
            if isinstance(m, TensorMap2D)] == ["values", A_COPY]


def test_slices_of_k_are_never_empty_and_sum_through_a_workspace():
    config = CONFIG.replace(split_k=16, bn=8)
    assert slicing(config, 1000) == (8, 1, 8)
    assert slicing(config, 100) == (1, 1, 1)
    assert slicing(config.replace(split_k=3), 1000) == (8, 3, 3)
    weight = random_weight(np.random.default_rng(2), 2, 4, 1, 1000, 300, dtype=DType.BF16)
    plan = SPTC.plan(config, prepare(weight, config), weight.shape, Call(1, 1000, True), DEVICE)
    assert plan.launches[-1].grid == (3, 1, 8)
    assert {w.name for w in plan.workspaces} == {SPLIT_SUMS, TILE_COUNTERS}


def test_the_model_prefers_large_tiles_at_prefill_and_slices_at_decode():
    problem = Problem(2, 4, 1, dtype="bf16")
    prefill = SPTC.default_config(problem, H100, (2048, 8192, 8192))
    decode = SPTC.default_config(problem, H100, (1, 2048, 8192))  # 16 column blocks
    assert prefill.bm * prefill.bn >= 128 * 128 and prefill.split_k == 1
    assert decode.bn <= 16 and decode.split_k > 1
    assert SPTC.feasible(decode, gpu_spec("a100")) is not None  # sm_90a only


NVCC_CONFIGS = [CONFIG.name,
                "nm_sptc_bf16_n2m4l1_b128x256x128_g2_s2_k1_rm_sm90a",  # setmaxnreg split
                "nm_sptc_f16_n2m4l1_b256x128x128_g2_s3_k1_rm_sm90a",  # two m64 tiles a thread
                "nm_sptc_bf16_n2m4l1_b64x8x128_g1_s8_k16_rm_sm90a",  # decode, slices of K
                "nm_sptc_bf16_n1m4l128_b128x64x128_g1_s4_k2_km_sm90a_bias_silu"]


@pytest.mark.nvcc
@pytest.mark.parametrize("name", NVCC_CONFIGS)
def test_named_configurations_compile_without_spills(name):
    from nmgen.compiler.nvcc import compile_with_nvcc

    config = SptcConfig.from_name(name)
    compiled = compile_with_nvcc(nmgen.render(config))
    main = compiled.resources[config.name]
    assert main.spill_stores == 0 and main.spill_loads == 0, f"{name}: {main}"
    assert main.stack_bytes == 0, f"{name}: {main}"
    blocks = min_blocks_per_sm(config)
    assert main.registers <= min(255, REGISTERS_PER_SM // (config.threads * blocks))
    assert "serialized" not in compiled.log, compiled.log  # wgmmas kept in flight
    split = config.register_split(blocks)
    if split is not None:
        assert main.registers == split[0], f"{name}: {main.registers} != {split}"


@pytest.mark.parametrize("m_tokens", [1, 8, 64])
def test_a_transfer_of_another_family_does_not_outrank_a_shorter_estimate(m_tokens):
    """Element-wise 2:4 decode on an H200 with the shipped records (none of L = 1): the
    gemv family's transfer from L = 128 problems (the H200's own of other patterns, or
    the H100's) is an estimate, as the sparse-tensor-core model's choice is; the shorter
    one runs. (Ranked by source, the transfer ran 0.05-0.91x dense BF16, the
    sparse-tensor-core choice 1.32-1.46x by M: results/sptc_h200/llama/summary.txt.)"""
    from nmgen.dispatch import ESTIMATES, Dispatcher
    from nmgen.runtime.device import DeviceInfo

    dispatcher = Dispatcher(None, device=DeviceInfo("NVIDIA H200", 132, 9, 0, 13000))
    problem = Problem(2, 4, 1, arch=Arch.SM90, dtype=DType.BF16)
    ranking = dispatcher._ranking(problem, (m_tokens, 11008, 4096))
    families = {d.config.family: d for d in ranking}
    assert families["gemv"].source in {"transfer", "other_gpu"}
    assert families["sptc"].source == "model"
    assert all(d.tier == ESTIMATES for d in ranking)
    assert ranking[0].config.family in {"sptc", "mmasp"}  # a sparse-tensor-core estimate
    assert ranking[0].time_ms < families["gemv"].time_ms
    assert [d.time_ms for d in ranking] == sorted(d.time_ms for d in ranking)


def test_a_groups_slots_hold_its_non_zero_positions_first_then_the_lowest_unused():
    from nmgen.families.sparse24.prepare import NON_ZEROS, SLOTS

    for mask in range(16):
        positions = [p for p in range(4) if mask >> p & 1]
        assert NON_ZEROS[mask] == len(positions)
        if len(positions) > 2:
            continue
        unused = [p for p in range(4) if p not in positions]
        assert list(SLOTS[mask]) == sorted(positions + unused[:2 - len(positions)])
