"""The Hopper tensor-core family (BF16/FP16, wgmma) on the CPU: its configurations, rules,
space, rendering, weight layout, launch plan, model and compile target; nvcc builds named
and sampled configurations for sm_90a with HGMMA instructions, without spills and without
wgmma serialization."""

from __future__ import annotations

import hashlib
import random
import sys
import types

import numpy as np
import pytest

import nmgen
from nmgen.compiler import nvrtc
from nmgen.families.mma import MMA
from nmgen.families.plan import Aligned16, Call, Device, Pointer, Scalar, TensorMap2D
from nmgen.families.registry import config_from_dict, config_from_name, serving
from nmgen.families.tensor_core.prepare import prepare, stage_count
from nmgen.families.wgmma import WGMMA, render
from nmgen.families.wgmma.config import Producer, WgmmaConfig
from nmgen.families.wgmma.model import estimate, stage_mma_cycles, tensor_tflops
from nmgen.families.wgmma.render import min_blocks_per_sm
from nmgen.gpus import REGISTERS_PER_SM, Arch, gpu_spec
from nmgen.problem import ALayout, Problem
from nmgen.runtime import tma
from nmgen.runtime.check import random_weight

H100 = gpu_spec("h100")
CONFIG = WgmmaConfig(8, 32, 128, bm=128, bn=128, windows=8, warpgroups=2, stages=4)
WARP = CONFIG.replace(producer="warp")  # a producer warpgroup of its own
TMA = CONFIG.replace(producer="tma")  # the producer warpgroup, B' by bulk copies
DEVICE = Device(132, lambda entry, threads, smem: 1)


def test_name_states_every_parameter_and_round_trips():
    assert CONFIG.name == "nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90a"
    assert WgmmaConfig.from_name(CONFIG.name) == CONFIG
    assert config_from_name(CONFIG.name) == CONFIG
    assert config_from_dict(CONFIG.to_dict()) == CONFIG
    other = CONFIG.replace(dtype="f16", bn=64, bm=256, epilogue="bias_gelu")
    assert other.name == "nm_wgmma_f16_n8m32l128_b256x64x64_g2_s4_km_sm90a_bias_gelu"
    assert config_from_name(other.name) == other and other.tiles_m == 2
    assert WGMMA.config_from_name("nm_mma_bf16_n8m32l128_b128x128x32_w2x2_s3_rm_sm90") is None
    assert MMA.config_from_name(CONFIG.name) is None
    with pytest.raises(nmgen.ConfigError, match="not a wgmma kernel name"):
        WgmmaConfig.from_name("nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90")


def test_a_producer_warpgroup_is_named_and_stored_only_where_it_is_one():
    assert WARP.producer is Producer.WARP and CONFIG.producer is Producer.SHARED
    assert WARP.name == "nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_ws_km_sm90a"
    assert WgmmaConfig.from_name(WARP.name) == WARP and config_from_name(WARP.name) == WARP
    assert config_from_dict(WARP.to_dict()) == WARP
    assert WgmmaConfig.from_json(WARP.to_json()) == WARP
    assert WARP.to_dict()["producer"] == "warp"
    # the shared kernel's JSON, name and source header are those it always had
    assert "producer" not in CONFIG.to_dict() and "producer" not in nmgen.render(CONFIG).code
    assert config_from_dict({**CONFIG.to_dict(), "producer": "shared"}) == CONFIG
    other = WARP.replace(dtype="f16", bn=64, bm=256, epilogue="bias_gelu", windows=4,
                         stages=6)
    assert other.name == "nm_wgmma_f16_n8m32l128_b256x64x32_g2_s6_ws_km_sm90a_bias_gelu"
    assert config_from_name(other.name) == other
    with pytest.raises(nmgen.ConfigError, match="producer='bulk'"):
        CONFIG.replace(producer="bulk")
    with pytest.raises(nmgen.ConfigError, match="not a wgmma kernel name"):
        WgmmaConfig.from_name("nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_ws_sm90a")


@pytest.mark.parametrize("change, rule", [
    (dict(dtype="f32"), "bf16 or f16"),
    (dict(arch="sm_80"), "arch sm_90"),
    (dict(bn=32), "one index set"),
    (dict(bn=256), "one index set"),  # L = 128
    (dict(windows=1), "whole k16 steps"),
    (dict(windows=32), "bk <= 128"),
    (dict(warpgroups=8, bm=512), "warpgroups <= 4"),
    (dict(bm=96), "tiles_m"),
    (dict(bm=512), "tiles_m"),
    (dict(stages=2), "stages"),
    (dict(stages=7), "stages"),
    (dict(vec=256, bn=256, bm=256), "accumulators"),
    (dict(windows=16, stages=6, bm=256), "shared memory"),
    (dict(n=0), "sizes >= 1"),
    (dict(arch="sm_75"), "arch="),
])
def test_rules_name_what_they_need(change, rule):
    values = {**CONFIG.to_dict(), **change}
    values.pop("family")
    with pytest.raises(nmgen.ConfigError, match=rule):
        WgmmaConfig(**values)


def test_sizes_threads_and_shared_memory():
    assert CONFIG.bk == 64 and CONFIG.bkd == 256 and CONFIG.threads == 256
    assert CONFIG.tiles_m == 1 and CONFIG.accumulators == 64
    # 4 stages of a 64 x 128 B' tile and a 64 x 128 A tile, and the 1024-byte alignment
    assert CONFIG.smem_bytes == 4 * (2 * 64 * 128 + 2 * 64 * 128) + 1024
    assert CONFIG.stage_bytes % 1024 == 0
    # a producer warpgroup: 128 threads more, and two mbarriers a stage
    assert WARP.threads == 384 and WARP.copy_threads == 128 and CONFIG.copy_threads == 256
    assert WARP.smem_bytes == CONFIG.smem_bytes + 2 * 4 * 8 and CONFIG.barrier_bytes == 0
    assert WARP.a_per_thread == 64 * 128 // 8 // 128 and CONFIG.a_per_thread == 4


def test_a_producer_warpgroup_gives_its_registers_to_the_mma_warpgroups_where_needed():
    # two m64 x 128 tiles a thread (128 accumulators), two blocks an SM: 128 registers a
    # thread at launch; the producer keeps 56, the MMA warpgroup takes the rest
    one = WgmmaConfig(16, 32, 128, bm=128, bn=128, windows=2, warpgroups=1, stages=4,
                      producer="warp")
    assert min_blocks_per_sm(one) == 2 and one.registers_estimate == 160
    assert one.register_split(2) == (128, 56, 200)
    assert one.fits_registers(2) and 128 * (56 + 200) <= 128 * 2 * 128
    code = nmgen.render(one).code
    assert "setmaxnreg.dec.sync.aligned.u32" in code and "setmaxnreg_dec<56>();" in code
    assert "setmaxnreg_inc<200>();" in code
    # launch leaves enough: no setmaxnreg
    two = WgmmaConfig(16, 32, 128, bm=128, bn=128, windows=2, warpgroups=2, stages=4,
                      producer="warp")
    assert min_blocks_per_sm(two) == 1 and two.register_split(1) is None
    assert "setmaxnreg" not in nmgen.render(two).code
    # ptxas needs N/2 + 26 registers at launch for a wgmma m64nN: two blocks of 384
    # threads (80 registers) cannot run m64n128, whatever setmaxnreg would give
    assert not two.fits_registers(2) and two.register_split(2) == (80, 56, 88)
    assert CONFIG.register_split(1) is None


def test_serves_bf16_and_f16_with_long_vectors_on_sm90():
    assert WGMMA in serving(Problem(8, 32, 128, ALayout.K_MAJOR, dtype="bf16"))
    assert WGMMA in serving(Problem(2, 4, 64, ALayout.K_MAJOR, dtype="f16"))
    assert WGMMA in serving(Problem(8, 32, 128, ALayout.ROW_MAJOR, dtype="bf16"))
    assert WGMMA.serves(Problem(8, 32, 128, ALayout.K_MAJOR)) is not None  # fp32
    assert "sm_90" in WGMMA.serves(Problem(8, 32, 128, ALayout.K_MAJOR, Arch.SM80, "bf16"))
    assert "L in" in WGMMA.serves(Problem(8, 32, 32, ALayout.K_MAJOR, dtype="bf16"))
    assert "m <= 64" in WGMMA.serves(Problem(2, 128, 64, ALayout.K_MAJOR, dtype="bf16"))


def test_compiles_for_the_arch_specific_target():
    assert WGMMA.compile_target(CONFIG) == "sm_90a"
    assert nmgen.render(CONFIG).target == "sm_90a"
    mma = MMA.config_from_name("nm_mma_bf16_n8m32l128_b128x128x32_w2x2_s3_rm_sm90")
    assert nmgen.render(mma).target == "sm_90"
    assert nvrtc.arch_specific("sm_90a") and not nvrtc.arch_specific("sm_90")
    assert not nvrtc.arch_specific(None)


PROBLEMS = [Problem(8, 32, 128, ALayout.K_MAJOR, dtype="bf16"),
            Problem(16, 32, 256, ALayout.K_MAJOR, dtype="bf16"),
            Problem(2, 4, 64, ALayout.K_MAJOR, dtype="f16"),
            Problem(1, 4, 128, ALayout.K_MAJOR, dtype="bf16"),
            Problem(16, 64, 64, ALayout.K_MAJOR, dtype="bf16"),
            Problem(4, 32, 256, ALayout.K_MAJOR, dtype="f16"),
            Problem(3, 7, 64, ALayout.K_MAJOR, dtype="bf16")]


@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_space_enumerates_and_samples_valid_configurations(problem):
    configs = WGMMA.seed_candidates(problem, WGMMA.space)
    assert configs and len({c.name for c in configs}) == len(configs)
    assert all(problem.vec % c.bn == 0 and c.bk % 16 == 0 and c.bn % 64 == 0
               for c in configs)
    assert all(c.smem_bytes <= c.arch.max_smem_per_block for c in configs)
    assert all(WGMMA.in_space(c, problem) for c in configs)
    # every shared-copy configuration has its producer-warpgroup twin
    shared = {c.name for c in configs if c.producer is Producer.SHARED}
    assert {c.replace(producer="shared").name for c in configs if c.specialized} == shared
    rng = random.Random(0)
    drawn = set()
    for _ in range(40):
        config = WGMMA.space.sample(problem, rng)
        assert WGMMA.space.config(problem, WGMMA.space.values_of(config)) == config
        assert WgmmaConfig.from_name(config.name) == config
        drawn.add(config.producer)
    assert drawn == set(Producer)


def test_selftest_draws_producer_warpgroups_through_the_space():
    from nmgen.bench.selftest import draw_config

    rng = random.Random(0)
    drawn = [draw_config(WGMMA, rng, Arch.SM90, H100) for _ in range(30)]
    assert {c.producer for c in drawn} == set(Producer)
    assert any(c.specialized and c.epilogue for c in drawn)


# The shared-copy kernel's source since its copies were planned once a thread (CopyPlan):
# sha256 of the rendered code with the version as "VERSION". Update only for a change of
# the shared-copy kernel itself.
SHARED_SOURCES = {
    "nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90a":
        "b3b233f271616185be08e669962d98ad0c0b7f9e871aa95a2ccc26a5c1895f3e",
    "nm_wgmma_bf16_n8m32l128_b256x128x64_g2_s3_km_sm90a":
        "059f2962d6a04b3dfac0554e1224f61074e70c1bb21335e5b3993a282f101375",
    "nm_wgmma_f16_n8m32l128_b128x128x64_g1_s4_km_sm90a":
        "63250e9515ce8dd06813dee08e66d2294ee71f7adaf4aa5c7ba71e962c7289f3",
    "nm_wgmma_bf16_n8m32l256_b128x256x64_g2_s3_km_sm90a":
        "23d4cdd63baf82261d0835eb15eeab8f4385492411410686b8d2f962fa3daabf",
    "nm_wgmma_f16_n2m4l64_b128x64x16_g2_s3_km_sm90a":
        "180e14dd814cf38c41465dc28b3713a23d3e7aa2c976526e1e20569d601c8319",
    "nm_wgmma_bf16_n3m7l128_b64x128x48_g1_s3_km_sm90a":
        "20409f59bc8a503df324a2e2d60ac5195e34237567cacca483991c7b34567c58",
    "nm_wgmma_bf16_n16m64l128_b128x128x128_g2_s3_km_sm90a_bias_silu":
        "56efcfcbc60bb18c037878c1944c450e946d40a79e8301e448562be18f55ba32",
    "nm_wgmma_bf16_n16m32l128_b128x128x32_g2_s4_km_sm90a":
        "e670eaee34e092fee0449d34fd0d66591964e8b76e7e0db8d06e97b86286e5e8",
    "nm_wgmma_f16_n4m32l128_b256x128x32_g2_s5_km_sm90a_bias_gelu":
        "3934c067fbcf59a7cc18b1d32da1ca93b94e0b3621fd400a3d1e049fd830797e",
    "nm_wgmma_bf16_n4m32l128_b128x128x32_g1_s6_km_sm90a_relu":
        "aeea4dae73577ecb90772736ab421af87c59e06ae1d95b9a3b95fbee8c04707b",
}


# Row-major A: the shared-copy kernel (its transpose kernel left out), pinned as above.
SHARED_RM_SOURCES = {
    "nm_wgmma_bf16_n8m32l128_b128x128x32_g2_s4_rm_sm90a":
        "a538cfcedd698a5fe04acd5031a8711ecd90de2982adc0e36a2deba1d926a0b3",
    "nm_wgmma_f16_n2m4l64_b128x64x16_g2_s3_rm_sm90a_bias_silu":
        "d966f909bd3a15b7d171b88bd26a017fa219a2c3d260323359b2523c3f1f06bc",
    "nm_wgmma_bf16_n16m64l128_b128x128x128_g2_s3_rm_sm90a":
        "d601e71e408136b6ce4399445426b6963f8d36dcfa65eb067d799a73451ad5a7",
}


@pytest.mark.parametrize("name, digest", [*SHARED_SOURCES.items(), *SHARED_RM_SOURCES.items()])
def test_the_shared_copy_kernel_renders_as_before_the_producer_warpgroup(name, digest):
    code = nmgen.render(WgmmaConfig.from_name(name)).code
    code = code.replace(f"nmgen {nmgen.__version__}", "nmgen VERSION")
    kernel = code.split("// Row-major A (M x K")[0]  # without row-major A's transpose kernel
    assert hashlib.sha256(kernel.encode()).hexdigest() == digest


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("bn", [64, 128, 256])
def test_render_reads_as_the_configuration(dtype, bn):
    config = CONFIG.replace(dtype=dtype, bn=bn, vec=256)
    code = nmgen.render(config).code
    assert config.name in code and f"nmgen {nmgen.__version__}" in code
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{dtype}.{dtype}" in code
    assert f"%{bn // 2 - 1}}}" in code and f'"+f"(d[{bn // 2 - 1}])' in code
    assert f'"+f"(d[{bn // 2}])' not in code
    assert f"cvt.rn.{dtype}x2.f32" in code
    assert "//   warpgroups = 2" in code
    assert f"== {config.smem_bytes}" in code
    assert f"__launch_bounds__(THREADS, {min_blocks_per_sm(config)})" in code
    assert "epilogue(" not in code
    assert "epilogue(x0, bias, col)" in nmgen.render(config.replace(epilogue="bias")).code
    assert "mbarrier" not in code and code.count("__syncthreads()") == 1


@pytest.mark.parametrize("a_vec_path", ["cp.async.mbarrier.arrive.noinc.shared::cta.b64",
                                        "cp.async.mbarrier.arrive.shared::cta.b64"])
def test_render_of_a_producer_warpgroup(a_vec_path):
    code = nmgen.render(WARP).code
    assert WARP.name in code and "//   producer   = warp" in code
    assert "constexpr int THREADS = 128 * (WARPGROUPS + 1);" in code
    assert "constexpr int COPY_THREADS = 128;" in code
    assert a_vec_path in code
    assert "mbarrier.try_wait.parity.shared::cta.b64" in code
    assert "mbarrier.init.shared::cta.b64" in code and "fence.proxy.async.shared::cta" in code
    # one block barrier (the mbarriers' initialisation), before the roles split
    assert code.count("__syncthreads()") == 1
    assert code.index("__syncthreads()") < code.index("if (warpgroup == WARPGROUPS)")
    assert f"== {WARP.smem_bytes}" in code and "cp_async_wait<" not in code.split(
        "extern \"C\"")[1]
    with_bias = nmgen.render(WARP.replace(epilogue="bias_relu")).code
    assert "epilogue(x0, bias, col)" in with_bias and "mbar_wait(full" in with_bias


@pytest.mark.parametrize("depth, cols", [(300, 130), (64, 128), (33, 7)])
def test_layout_pads_to_whole_stages_and_marks_rows_past_k(depth, cols):
    rng = np.random.default_rng(depth)
    weight = random_weight(rng, 2, 8, 64, depth, cols, dtype=nmgen.DType.BF16)
    config = WgmmaConfig(2, 8, 64, bm=64, bn=64, windows=8, warpgroups=1, stages=3)
    prepared = prepare(weight, config)
    values, rows = prepared.arrays["values"], prepared.arrays["rows"]
    stages = stage_count(config, depth)
    assert values.shape == (stages * 16, -(-cols // 64) * 64)
    assert values.dtype == weight._values.dtype
    assert rows.shape == (-(-cols // 64), stages * 16) and rows.dtype == np.int32
    w = weight._values.shape[0]
    np.testing.assert_array_equal(values[:w].astype(np.float32),
                                  weight._values.astype(np.float32))
    assert not values[w:].astype(np.float32).any()
    kept = weight.kept_rows().T
    np.testing.assert_array_equal(rows[:, :w], np.where(kept < depth, kept, -1))
    assert (rows[:, w:] == -1).all()
    stage_of_row = np.arange(rows.shape[1]) // config.bk
    live = rows >= 0
    assert (rows[live] // config.bkd == np.broadcast_to(stage_of_row, rows.shape)[live]).all()
    with pytest.raises(ValueError, match="takes f16"):
        prepare(weight, config.replace(dtype="f16"))
    with pytest.raises(ValueError, match="is for 2:8 L=64"):
        prepare(random_weight(rng, 2, 8, 128, depth, cols, dtype=nmgen.DType.BF16), config)


@pytest.mark.parametrize("lda, aligned, vec", [(304, True, 1), (303, True, 0), (304, False, 0)])
def test_plan_is_one_launch_over_row_and_column_blocks(lda, aligned, vec):
    weight = random_weight(np.random.default_rng(0), 8, 32, 128, 300, 200,
                           dtype=nmgen.DType.BF16)
    prepared = prepare(weight, CONFIG)
    plan = WGMMA.plan(CONFIG, prepared, weight.shape, Call(300, lda, aligned), DEVICE)
    (launch,) = plan.launches
    assert launch.entry == CONFIG.name and launch.grid == (3, 2, 1)
    assert launch.threads == 256 and launch.smem == CONFIG.smem_bytes
    assert {a.buffer for a in launch.args if isinstance(a, Pointer)} == {
        "a", "values", "rows", "c"}
    scalars = [a.value for a in launch.args if isinstance(a, Scalar)]
    assert scalars == [300, 200, 300, lda, 256, stage_count(CONFIG, 300) * 64,
                       stage_count(CONFIG, 300), vec]
    assert launch.args[-1] == Aligned16("c", True)
    with_bias = CONFIG.replace(epilogue="bias_relu")
    (launch,) = WGMMA.plan(with_bias, prepared, weight.shape, Call(300, lda, aligned),
                           DEVICE).launches
    assert launch.args[-1] == Pointer("bias")
    (launch,) = WGMMA.plan(WARP, prepared, weight.shape, Call(300, lda, aligned),
                           DEVICE).launches
    assert launch.entry == WARP.name and launch.threads == 384
    assert launch.smem == WARP.smem_bytes == CONFIG.smem_bytes + 64


@pytest.mark.parametrize("lda, aligned, vec", [(400, True, 1), (401, True, 0),
                                               (402, True, 0), (400, False, 0)])
def test_row_major_a_is_transposed_into_a_k_major_copy_first(lda, aligned, vec):
    """Row-major A (M x K, rows lda apart): the transpose kernel writes the K-major copy
    (rows padded to 8 elements, 16-byte copies for the kernel), which the kernel reads."""
    config = CONFIG.replace(a_layout="rm")
    assert config.name == CONFIG.name.replace("_km_", "_rm_")
    assert WgmmaConfig.from_name(config.name) == config
    assert render.entry_points(config) == (config.name, config.name + "_transpose")
    assert "_transpose(" in nmgen.render(config).code
    assert "_transpose(" not in nmgen.render(CONFIG).code
    weight = random_weight(np.random.default_rng(0), 8, 32, 128, 300, 200,
                           dtype=nmgen.DType.BF16)
    prepared = prepare(weight, config)
    plan = WGMMA.plan(config, prepared, weight.shape, Call(301, lda, aligned), DEVICE)
    copy, main = plan.launches
    (workspace,) = plan.workspaces
    ldt = 304  # 301 rows padded to 8
    # 128 rows of M by 128 of K a block, 16-byte reads of A where its rows are 16-byte aligned
    assert copy.entry == config.name + "_transpose" and copy.grid == (3, 3, 1)
    assert [a.value for a in copy.args if isinstance(a, Scalar)] == [301, 300, lda, ldt, vec]
    assert workspace.name == "a_copy" and workspace.count == 300 * ldt
    assert workspace.dtype.itemsize == 2
    assert main.entry == config.name and main.args[0] == Pointer("a_copy")
    scalars = [a.value for a in main.args if isinstance(a, Scalar)]
    assert scalars[3] == ldt and scalars[-1] == 1  # K-major rows ldt apart, 16-byte copies
    km = estimate(CONFIG, H100, 4096, 4096, 4096).time_ms
    rm = estimate(config, H100, 4096, 4096, 4096).time_ms
    assert km < rm < 1.5 * km


def test_a_producer_warpgroup_reads_row_major_a_through_the_same_copy():
    """Row-major A with a producer warpgroup: the same transpose and workspace, and the
    kernel takes the shared kernel's arguments; only its block (the producer's 128
    threads) and shared memory (the mbarriers) differ."""
    shared = CONFIG.replace(a_layout="rm")
    warp = shared.replace(producer="warp")
    assert warp.name == "nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_ws_rm_sm90a"
    assert WgmmaConfig.from_name(warp.name) == warp and config_from_dict(warp.to_dict()) == warp
    assert warp.a_copied and warp.a_stage_depth == warp.bk
    assert render.entry_points(warp) == (warp.name, warp.name + "_transpose")
    code = nmgen.render(warp).code
    assert "_transpose(" in code and "mbar_wait(full" in code
    weight = random_weight(np.random.default_rng(0), 8, 32, 128, 300, 200,
                           dtype=nmgen.DType.BF16)
    prepared = prepare(weight, warp)
    for call in (Call(301, 400, True), Call(301, 401, False)):
        theirs = WGMMA.plan(shared, prepared, weight.shape, call, DEVICE)
        ours = WGMMA.plan(warp, prepared, weight.shape, call, DEVICE)
        assert ours.workspaces == theirs.workspaces
        (copy, main), (their_copy, their_main) = ours.launches, theirs.launches
        assert copy.entry == warp.name + "_transpose"
        assert (copy.grid, copy.threads, copy.smem, copy.args) == (
            their_copy.grid, their_copy.threads, their_copy.smem, their_copy.args)
        assert main.entry == warp.name and main.args == their_main.args
        assert main.grid == their_main.grid
        assert main.threads == warp.threads == 384 and their_main.threads == 256
        assert main.smem == warp.smem_bytes == shared.smem_bytes + 64
    # the model: the transpose before the kernel
    for shape in [(4096, 4096, 4096), (128, 11008, 4096)]:
        assert (estimate(warp, H100, *shape).time_ms
                > estimate(CONFIG.replace(producer="warp"), H100, *shape).time_ms)


# ------------------------------------------------------------------------ bulk copies
def test_a_bulk_copy_producer_is_named_stored_and_sized_as_its_ws_twin():
    assert TMA.producer is Producer.TMA and TMA.tma and TMA.specialized
    assert not WARP.tma and not CONFIG.tma
    assert TMA.name == "nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_tma_km_sm90a"
    assert WgmmaConfig.from_name(TMA.name) == TMA and config_from_name(TMA.name) == TMA
    assert config_from_dict(TMA.to_dict()) == TMA and TMA.to_dict()["producer"] == "tma"
    assert WgmmaConfig.from_json(TMA.to_json()) == TMA
    other = TMA.replace(dtype="f16", bn=64, bm=256, epilogue="bias_gelu", windows=4,
                        stages=6, a_layout="rm")
    assert other.name == "nm_wgmma_f16_n8m32l128_b256x64x32_g2_s6_tma_rm_sm90a_bias_gelu"
    assert config_from_name(other.name) == other
    for name in ("nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_ws_tma_km_sm90a",
                 "nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_tmaws_km_sm90a"):
        with pytest.raises(nmgen.ConfigError, match="not a wgmma kernel name"):
            WgmmaConfig.from_name(name)
    # the _ws twin: what the model estimates it as
    assert TMA.ws_twin() == WARP and WARP.ws_twin() is WARP and CONFIG.ws_twin() is CONFIG
    assert (TMA.threads, TMA.smem_bytes, TMA.barrier_bytes, TMA.a_per_thread) == (
        WARP.threads, WARP.smem_bytes, WARP.barrier_bytes, WARP.a_per_thread)
    # its producer holds the A chunks' state, not the B' chunks'
    assert TMA.producer_registers == 48 < WARP.producer_registers == 72


def test_a_bulk_copy_producer_gives_the_mma_warpgroups_more_registers():
    one = WgmmaConfig(16, 32, 128, bm=128, bn=128, windows=2, warpgroups=1, stages=4,
                      producer="tma")
    assert min_blocks_per_sm(one) == 2
    assert one.register_split(2) == (128, 48, 208)
    assert one.ws_twin().register_split(2) == (128, 56, 200)
    code = nmgen.render(one).code
    assert "setmaxnreg_dec<48>();" in code and "setmaxnreg_inc<208>();" in code
    two = one.replace(warpgroups=2)
    assert min_blocks_per_sm(two) == 1 and "setmaxnreg" not in nmgen.render(two).code


def test_every_bulk_copy_configuration_of_the_space_has_its_ws_twin():
    for problem in PROBLEMS[:3]:
        configs = list(WGMMA.space.enumerate(problem))
        names = {c.name for c in configs}
        bulk = [c for c in configs if c.tma]
        assert bulk and all(c.ws_twin().name in names for c in bulk)
        # and every _ws configuration its bulk-copy one
        assert {c.replace(producer="tma").name for c in configs
                if c.producer is Producer.WARP} == {c.name for c in bulk}


def test_render_of_a_bulk_copy_producer():
    code = nmgen.render(TMA).code
    twin = nmgen.render(WARP).code
    assert TMA.name in code and "//   producer   = tma" in code
    body = code.split('extern "C"')[1]
    # the A tile as the _ws producer copies it: all 128 threads, 16-byte cp.async, each
    # arriving on the full barrier as its copies land
    assert "mbar_init(full + 8 * b, COPY_THREADS);" in body
    assert "arrive_on_copies(full + 8 * buffer, !a_vec);" in body
    assert "cp.async.mbarrier.arrive.noinc" in code and "cp_async_wait_all();" in body
    assert "if (threadIdx.x % 128 >= 32) return;" not in body
    # but not the B' tile: no B' chunks in its copies
    assert "p.b_src" not in code and "b_src" not in code.split("load_stage(")[1]
    assert "p.b_src = values" in twin
    # B' by the engine: producer thread 0 announces its bytes (no arrival) and issues the
    # BN / 64 boxes of 64 columns x BK rows, before its own arrival
    assert "mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" in code
    assert "mbarrier.arrive.expect_tx" not in code
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile" in code
    assert ".mbarrier::complete_tx::bytes" in code
    assert "mbar_expect_tx(bar, B_TILE_BYTES);" in code
    assert "tma_copy_2d(stage_sh + b * ATOM_BYTES, b_map, n0 + 64 * b, s * BK, bar);" in code
    producer = body.split("if (warpgroup == WARPGROUPS)")[1].split("setmaxnreg_inc")[0]
    assert producer.index("if (threadIdx.x % 128 == 0)") < producer.index(
        "tma_b_tile(smem_sh + buffer * STAGE_BYTES, full + 8 * buffer, &b_map, n0, s);") \
        < producer.index("load_stage(") < producer.index("arrive_on_copies(")
    # one tensor map (the values'); the MMA side fences the A copies to the async proxy
    assert "const __grid_constant__ TmaMap b_map" in code and "a_map" not in code
    assert "fence_proxy_async();" in body
    assert code.count("__syncthreads()") == 1 and "mbar_wait(empty" in body
    assert f"== {TMA.smem_bytes}" in code
    with_bias = nmgen.render(TMA.replace(epilogue="bias_relu")).code
    assert "TmaMap b_map, const bias_t* __restrict__ bias" in with_bias
    # the rest as the _ws twin's: the MMA warpgroups' loop and the epilogue
    assert code.split("float acc[TILES_M][ACC];")[1] == twin.split("float acc[TILES_M][ACC];")[1]


def plan_weight(config: WgmmaConfig):
    weight = random_weight(np.random.default_rng(0), 8, 32, 128, 300, 200,
                           dtype=nmgen.DType.BF16)
    return weight, prepare(weight, config)


@pytest.mark.parametrize("epilogue", [None, "bias_silu"])
def test_a_bulk_copy_plan_appends_a_swizzled_map_of_the_values(epilogue):
    config, warp = TMA.replace(epilogue=epilogue), WARP.replace(epilogue=epilogue)
    weight, prepared = plan_weight(config)
    values = prepared.arrays["values"]
    assert values.shape[1] % 64 == 0 and values.shape[0] % config.bk == 0
    for call in (Call(300, 304, True), Call(300, 303, True), Call(301, 304, False)):
        plan = WGMMA.plan(config, prepared, weight.shape, call, DEVICE)
        (launch,) = plan.launches
        (twin,) = WGMMA.plan(warp, prepared, weight.shape, call, DEVICE).launches
        assert plan.instead is None and launch.entry == config.name
        assert (launch.grid, launch.threads, launch.smem) == (
            twin.grid, twin.threads, twin.smem)
        maps = [a for a in launch.args if isinstance(a, TensorMap2D)]
        assert maps == [TensorMap2D("values", values.shape[1], values.shape[0],
                                    values.shape[1], (64, config.bk), 2, swizzle_128b=True)]
        # the _ws twin's arguments (a_vec 0 where A is not 16-byte addressable), the map
        # after them (before the bias)
        head = len(twin.args) - (1 if epilogue else 0)
        assert launch.args[:head] == twin.args[:head] and launch.args[head] == maps[0]
        assert launch.args[head + 1:] == twin.args[head:]


def test_a_bulk_copy_producer_reads_row_major_a_through_the_transposed_copy():
    config = TMA.replace(a_layout="rm")
    weight, prepared = plan_weight(config)
    for call in (Call(301, 400, True), Call(301, 401, False)):
        plan = WGMMA.plan(config, prepared, weight.shape, call, DEVICE)
        twin = WGMMA.plan(config.ws_twin(), prepared, weight.shape, call, DEVICE)
        assert plan.instead is None and plan.workspaces == twin.workspaces
        copy, main = plan.launches
        assert copy == twin.launches[0].__class__(
            config.name + "_transpose", *[getattr(twin.launches[0], f)
                                          for f in ("grid", "threads", "smem", "args")])
        assert main.args[0] == twin.launches[1].args[0]  # the K-major copy
        assert [a.buffer for a in main.args if isinstance(a, TensorMap2D)] == ["values"]


def test_the_model_takes_a_bulk_copy_producer_for_its_ws_twin():
    for shape in [(4096, 4096, 4096), (128, 11008, 4096), (37, 200, 300)]:
        assert estimate(TMA, H100, *shape) == estimate(WARP, H100, *shape)
    assert WGMMA.feasible(TMA, H100) is None
    assert "sm_90a" in WGMMA.feasible(TMA, gpu_spec("a100"))


def test_bulk_copy_producers_are_drawn_not_seeded_and_refine_ws_winners():
    problem = PROBLEMS[0]
    assert not any(c.tma for c in WGMMA.seed_candidates(problem, WGMMA.space))
    rng = random.Random(2)
    assert any(WGMMA.space.sample(problem, rng).tma for _ in range(40))
    assert WGMMA.in_space(TMA, problem)
    assert WGMMA.refinements(WARP) == [TMA]
    assert WGMMA.refinements(CONFIG) == [] and WGMMA.refinements(TMA) == []
    tuned = WgmmaConfig.from_name(TUNED_FASTEST[128])
    assert WGMMA.default_config(Problem(8, 32, 128, ALayout.ROW_MAJOR, dtype="bf16"), H100,
                                (1024, 8192, 8192)) == tuned  # the _ws kernel, not its twin


class _FakeEncode:
    """cuTensorMapEncodeTiled, recording its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)
        return 0


@pytest.mark.parametrize("swizzle, mode", [(False, 0), (True, 3)])
def test_tensor_maps_are_encoded_with_the_128_byte_swizzle_where_asked(monkeypatch, swizzle,
                                                                       mode):
    from nmgen.runtime.launch import _MapSlot

    fake = _FakeEncode()
    monkeypatch.setattr(tma, "_encode_tiled", lambda: fake)
    out = tma.TensorMap()
    tma.encode_matrix(out, 0x1000, 300, 200, 304, (64, 1), 2, swizzle)
    args = fake.calls[0]
    assert args[1] == 1 and args[2].value == 2  # UINT16, two dimensions
    assert list(args[4]) == [300, 200] and list(args[5]) == [608] and list(args[6]) == [64, 1]
    assert args[9] == mode and args[8] == args[10] == args[11] == 0
    spec = TensorMap2D("a", 300, 200, 304, (64, 1), 2, swizzle_128b=swizzle)
    _MapSlot(tma.TensorMap(), spec).point_at(0x2000)
    assert fake.calls[1][9] == mode and fake.calls[1][3].value == 0x2000
    # fp32 maps as before: no swizzle unless asked
    tma.encode_matrix(out, 0x1000, 300, 200, 304, (32, 32))
    assert fake.calls[2][9] == 0 and fake.calls[2][1] == 7


def test_a_swizzled_map_refuses_box_rows_past_128_bytes(monkeypatch):
    monkeypatch.setattr(tma, "_encode_tiled", lambda: _FakeEncode())
    with pytest.raises(ValueError, match="at most 128 bytes"):
        tma.encode_matrix(tma.TensorMap(), 0x1000, 300, 200, 304, (128, 1), 2, True)
    with pytest.raises(ValueError, match="16-byte aligned"):
        tma.encode_matrix(tma.TensorMap(), 0x1000, 300, 200, 303, (64, 1), 2, True)


def test_model_ranks_big_tiles_first_at_large_shapes_and_sparsity_pays():
    shape = (4096, 4096, 4096)
    best = {}
    for n in (16, 8, 4):
        problem = Problem(n, 32, 128, ALayout.K_MAJOR, dtype="bf16")
        ranked = WGMMA.ranker(WGMMA.seed_candidates(problem, WGMMA.space), H100).rank(*shape)
        best[n] = ranked[0]
        assert ranked[0][1].bm * ranked[0][1].bn >= 128 * 128, ranked[0][1].name
    assert best[4][0] < best[8][0] < best[16][0]
    ms, config = best[16]  # never faster than the tensor cores' peak on the compressed product
    assert ms > 2 * 4096 * 4096 * 2048 / (tensor_tflops(H100) * 1e12) * 1e3
    assert stage_mma_cycles(config, H100) > 0


# The bf16 tune of 8:32 row-major A on an H100 (results/untuned_h100/bf16/): its fastest
# kernel at 1024 x 8192 x 8192, the fastest on 20 of its 32 shapes at L = 128 and 16 at L = 64.
TUNED_FASTEST = {128: "nm_wgmma_bf16_n8m32l128_b128x128x64_g1_s3_ws_rm_sm90a",
                 64: "nm_wgmma_bf16_n8m32l64_b128x64x32_g1_s4_rm_sm90a"}


@pytest.mark.parametrize("vec", sorted(TUNED_FASTEST))
def test_model_picks_the_tuned_fastest_kernel_of_the_bf16_tune(vec):
    problem = Problem(8, 32, vec, ALayout.ROW_MAJOR, dtype="bf16")
    assert WGMMA.default_config(problem, H100, (1024, 8192, 8192)).name == TUNED_FASTEST[vec]


def test_model_lets_a_producer_warpgroup_hide_what_one_stage_ahead_exposes():
    """Three stages of shared copies keep one in flight, so a block waits for each stage's
    copies; a producer warpgroup keeps two in flight and runs them beside the wgmmas, but
    reads each stage's row indices behind the SM's copies: it pays where stages are short."""
    warp = WgmmaConfig.from_name(TUNED_FASTEST[128])
    shared = warp.replace(producer="shared")
    for shape in [(1024, 8192, 8192), (4096, 4096, 4096)]:
        assert estimate(warp, H100, *shape).time_ms < estimate(shared, H100, *shape).time_ms
    short = warp.replace(windows=2, stages=5)  # 16-row stages
    assert (estimate(short, H100, 1024, 8192, 8192).time_ms
            > estimate(short.replace(producer="shared"), H100, 1024, 8192, 8192).time_ms)


def test_model_prefers_wgmma_to_mma_sync_on_k_major_prefill():
    problem = Problem(8, 32, 128, ALayout.K_MAJOR, dtype="bf16")
    wgmma = WGMMA.ranker(WGMMA.seed_candidates(problem, WGMMA.space), H100)
    mma = MMA.ranker(MMA.seed_candidates(problem, MMA.space), H100)
    assert wgmma.rank(4096, 4096, 4096)[0][0] < mma.rank(4096, 4096, 4096)[0][0]


def test_model_grows_with_m_counts_blocks_and_needs_sm90():
    times = [estimate(CONFIG, H100, m, 4096, 4096).time_ms for m in (1, 256, 1024, 4096)]
    assert times == sorted(times)
    assert estimate(CONFIG, H100, 4096, 4096, 4096).blocks == 32 * 32
    assert "sm_90a" in WGMMA.feasible(CONFIG, gpu_spec("a100"))
    assert WGMMA.feasible(CONFIG, H100) is None


# ------------------------------------------------------------------------ NVRTC
class _FakeNvrtc(types.SimpleNamespace):
    """NVRTC's CuPy binding, recording the options a compile gets."""

    class NVRTCError(RuntimeError):
        pass

    def __init__(self) -> None:
        super().__init__(options=[], compiles=0)

    def getVersion(self):
        return (13, 0)

    def createProgram(self, code, name, headers, include_names):
        return 7

    def compileProgram(self, program, options):
        self.options.append(list(options))
        self.compiles += 1

    def getCUBIN(self, program):
        return b"\x7fELF cubin"

    def destroyProgram(self, program):
        pass

    def getProgramLog(self, program):
        return "log"


def test_arch_specific_targets_compile_to_a_cached_cubin(monkeypatch, tmp_path):
    fake = _FakeNvrtc()
    monkeypatch.setitem(sys.modules, "cupy_backends", types.ModuleType("cupy_backends"))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda", types.ModuleType("cuda"))
    libs = types.ModuleType("libs")
    libs.nvrtc = fake
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs", libs)
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.nvrtc", fake)
    monkeypatch.setattr(nvrtc, "cupy", lambda: None)
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    source = nmgen.render(CONFIG)
    path = nvrtc.build_cubin(source.code, source.target)
    assert path.read_bytes() == b"\x7fELF cubin" and path.parent.parent == tmp_path
    assert "-arch=sm_90a" in fake.options[0] and "-ftz=true" in fake.options[0]
    assert nvrtc.build_cubin(source.code, source.target) == path and fake.compiles == 1
    assert nvrtc.compile_one(CONFIG.to_json()) is None and fake.compiles == 1


# ------------------------------------------------------------------------ nvcc
NVCC_CONFIGS = [  # ptxas (CUDA 13.0) registers in the comments
    "nm_wgmma_bf16_n8m32l128_b128x128x64_g2_s4_km_sm90a",  # 136
    "nm_wgmma_bf16_n8m32l128_b256x128x64_g2_s3_km_sm90a",  # 200: two m64 tiles a warpgroup
    "nm_wgmma_f16_n8m32l128_b128x128x64_g1_s4_km_sm90a",  # 186
    "nm_wgmma_bf16_n8m32l256_b128x256x64_g2_s3_km_sm90a",  # 200: n256
    "nm_wgmma_bf16_n16m32l64_b64x64x32_g1_s5_km_sm90a",  # 72
    "nm_wgmma_f16_n2m4l64_b128x64x16_g2_s3_km_sm90a",  # 112
    "nm_wgmma_bf16_n3m7l128_b64x128x48_g1_s3_km_sm90a",  # 128
    "nm_wgmma_bf16_n16m64l128_b128x128x128_g2_s3_km_sm90a_bias_silu",  # 142
    "nm_wgmma_bf16_n8m32l128_b128x128x32_g2_s4_rm_sm90a",  # row-major A: the transpose too
]


def check_resources(config: WgmmaConfig) -> None:
    from nmgen.compiler.nvcc import compile_with_nvcc

    compiled = compile_with_nvcc(nmgen.render(config))
    main = compiled.resources[config.name]
    assert main.spill_stores == 0 and main.spill_loads == 0, f"{config.name}: {main}"
    assert main.stack_bytes == 0, f"{config.name}: {main}"
    budget = min(255, REGISTERS_PER_SM // (config.threads * min_blocks_per_sm(config)))
    assert main.registers <= budget, f"{config.name}: {main.registers} > {budget}"
    assert "sm_90a" in compiled.log
    assert "serialized" not in compiled.log, compiled.log  # wgmmas kept in flight
    split = config.register_split(min_blocks_per_sm(config))
    if split is not None:
        # setmaxnreg moves registers inside the block's pool: the launch count must be the
        # one the split assumes, or setmaxnreg.inc would wait for registers forever
        assert main.registers == split[0], f"{config.name}: {main.registers} != {split}"


@pytest.mark.nvcc
@pytest.mark.parametrize("name", NVCC_CONFIGS)
def test_named_configurations_compile_without_spills(name):
    check_resources(WgmmaConfig.from_name(name))


@pytest.mark.nvcc
@pytest.mark.parametrize("seed", range(6))
def test_sampled_configurations_compile_without_spills(seed):
    rng = random.Random(seed)
    problem = Problem(*rng.choice([(2, 4), (8, 32), (16, 32), (4, 32), (1, 4), (16, 64)]),
                      rng.choice([64, 128, 256]), ALayout.K_MAJOR, Arch.SM90,
                      rng.choice(["bf16", "f16"]))
    check_resources(WGMMA.space.sample(problem, rng))


# Producer warpgroups: ptxas (CUDA 13.0) registers at launch, and setmaxnreg's split
NVCC_WARP = [
    "nm_wgmma_bf16_n16m32l128_b128x128x32_g2_s4_ws_km_sm90a",  # 90
    "nm_wgmma_bf16_n4m32l128_b128x128x32_g2_s6_ws_km_sm90a",  # 90
    "nm_wgmma_bf16_n8m32l128_b256x128x64_g2_s4_ws_km_sm90a",  # 154: two m64 tiles a thread
    "nm_wgmma_bf16_n16m32l128_b256x128x32_g2_s5_ws_km_sm90a",  # 154
    "nm_wgmma_bf16_n16m32l128_b128x128x32_g1_s4_ws_km_sm90a",  # 128 -> 56 / 200
    "nm_wgmma_f16_n16m32l128_b128x128x64_g1_s3_ws_km_sm90a",  # 128 -> 72 / 184
    "nm_wgmma_bf16_n16m32l64_b256x64x32_g2_s5_ws_km_sm90a",  # 80 -> 48 / 96
    "nm_wgmma_bf16_n16m32l256_b64x256x64_g1_s3_ws_km_sm90a",  # 154: n256
    "nm_wgmma_f16_n2m4l64_b64x64x16_g1_s6_ws_km_sm90a_bias_silu",  # 58
    "nm_wgmma_bf16_n16m64l128_b128x128x128_g2_s3_ws_km_sm90a_bias_gelu",  # 151
    "nm_wgmma_bf16_n8m32l128_b128x128x32_g2_s4_ws_rm_sm90a",  # row-major A: the transpose
    "nm_wgmma_f16_n16m32l128_b128x128x32_g1_s4_ws_rm_sm90a_bias_silu",  # 128 -> 56 / 200
]


def warp_sample(count: int = 16) -> list[WgmmaConfig]:
    """Producer-warpgroup configurations drawn over what the brief of the variant names:
    patterns 16:32, 8:32, 4:32, 2:4; L 64, 128, 256; bk 16, 32, 64; one or two MMA
    warpgroups; 3-6 stages; BF16 and FP16; every other one with an epilogue."""
    rng = random.Random(1)
    patterns, vecs, bks = [(16, 32), (8, 32), (4, 32), (2, 4)], [64, 128, 256], [16, 32, 64]
    epilogues = ["bias", "gelu", "bias_silu", "relu"]
    configs: dict[str, WgmmaConfig] = {}
    while len(configs) < count:
        i = len(configs)
        (n, m), vec, bk = patterns[i % 4], vecs[i % 3], bks[(i // 4) % 3]
        if bk % n:
            continue
        try:
            config = WgmmaConfig(n, m, vec, bm=rng.choice([64, 128, 256]),
                                 bn=rng.choice([b for b in (64, 128, 256) if vec % b == 0]),
                                 windows=bk // n, warpgroups=1 + i % 2, stages=3 + i % 4,
                                 dtype=("bf16", "f16")[(i // 2) % 2], producer="warp",
                                 epilogue=epilogues[i // 2 % 4] if i % 2 else None)
        except nmgen.ConfigError:
            continue
        configs[config.name] = config
    return list(configs.values())


def test_the_producer_warpgroup_sample_spans_the_brief():
    sample = warp_sample()
    assert all(c.specialized for c in sample) and len(sample) == 16
    assert {(c.n, c.m) for c in sample} == {(16, 32), (8, 32), (4, 32), (2, 4)}
    assert {c.vec for c in sample} == {64, 128, 256} and {c.bk for c in sample} == {16, 32, 64}
    assert {c.warpgroups for c in sample} == {1, 2} and {c.stages for c in sample} == {3, 4, 5, 6}
    assert {c.dtype.value for c in sample} == {"bf16", "f16"}
    assert any(c.epilogue for c in sample) and not all(c.epilogue for c in sample)


@pytest.mark.nvcc
@pytest.mark.parametrize("name", NVCC_WARP)
def test_named_producer_warpgroup_configurations_compile_without_spills(name):
    check_resources(WgmmaConfig.from_name(name))


@pytest.mark.nvcc
@pytest.mark.parametrize("index", range(16))
def test_sampled_producer_warpgroup_configurations_compile_without_spills(index):
    check_resources(warp_sample()[index])


# Bulk-copy producers: the _tma twins of the producer-warpgroup kernels above
NVCC_TMA = [name.replace("_ws_", "_tma_") for name in NVCC_WARP]


def check_producer_registers(config: WgmmaConfig) -> None:
    """Where setmaxnreg splits the registers, the producer's share is its estimate, at most
    its _ws twin's (and ``check_resources`` found no spill, so its copies fit it)."""
    split = config.register_split(min_blocks_per_sm(config))
    if split is not None:
        assert split[1] == config.producer_registers, f"{config.name}: {split}"
        assert split[1] <= config.ws_twin().producer_registers, f"{config.name}: {split}"


def test_the_bulk_copy_sample_splits_registers_in_some():
    configs = [WgmmaConfig.from_name(name) for name in NVCC_TMA]
    assert all(c.tma for c in configs) and len(configs) == 12
    split = [c for c in configs if c.register_split(min_blocks_per_sm(c)) is not None]
    assert len(split) >= 4


@pytest.mark.nvcc
@pytest.mark.parametrize("name", NVCC_TMA)
def test_named_bulk_copy_configurations_compile_without_spills(name):
    config = WgmmaConfig.from_name(name)
    check_resources(config)
    check_producer_registers(config)


# The largest A tiles a bulk-copy producer gathers (24, 16, 12 chunks a thread), compiled
# with its setmaxnreg.dec forced to its estimate (64, 56, 56; one granule fewer spills).
TMA_FORCED_SPLIT = [
    "nm_wgmma_bf16_n12m32l64_b256x64x96_g4_s3_tma_km_sm90a",
    "nm_wgmma_bf16_n16m32l64_b128x64x128_g2_s3_tma_km_sm90a",
    "nm_wgmma_f16_n16m32l256_b128x256x96_g2_s3_tma_km_sm90a_bias_silu",  # 4 B' boxes
]


@pytest.mark.nvcc
@pytest.mark.parametrize("name", TMA_FORCED_SPLIT)
def test_the_bulk_copy_producer_fits_its_registers_in_the_largest_stages(name, monkeypatch):
    from nmgen.codegen import render_text
    from nmgen.compiler.nvcc import compile_with_nvcc

    config = WgmmaConfig.from_name(name)
    launch = config.launch_registers(min_blocks_per_sm(config))
    assert launch < 255 and config.register_split(min_blocks_per_sm(config)) is None
    producer = config.producer_registers
    assert producer < config.ws_twin().producer_registers
    split = (launch, producer, launch)  # the MMA threads keep theirs
    arguments = WGMMA.template_arguments
    monkeypatch.setattr(WGMMA, "template_arguments",
                        lambda c: {**arguments(c), "registers": split})
    template = (WGMMA.templates / WGMMA.template_name(config)).read_text()
    rendered = render_text(config, template)
    assert f"setmaxnreg_dec<{producer}>" in rendered.code
    main = compile_with_nvcc(rendered).resources[config.name]
    assert main.spill_stores == main.spill_loads == main.stack_bytes == 0, f"{name}: {main}"


@pytest.mark.nvcc
def test_the_kernel_is_hgmma_with_both_operands_transposed(tmp_path):
    """Where the CUDA disassembler is present: the main loop is HGMMA from two shared
    memory descriptors, MN-major (tnspA, tnspB)."""
    import shutil
    import subprocess

    from nmgen.compiler.nvcc import compile_with_nvcc

    disassembler = shutil.which("nvdisasm")
    if disassembler is None:
        pytest.skip("nvdisasm not found")
    cubin = compile_with_nvcc(nmgen.render(CONFIG)).path
    sass = subprocess.run([disassembler, "-c", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    hgmma = [line for line in sass.splitlines() if "HGMMA.64x128x16.F32.BF16" in line]
    assert len(hgmma) == CONFIG.bk // 16 * CONFIG.tiles_m
    assert all("tnspA.tnspB" in line for line in hgmma)
