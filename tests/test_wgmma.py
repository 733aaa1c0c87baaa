"""The Hopper tensor-core family (BF16/FP16, wgmma) on the CPU: its configurations, rules,
space, rendering, weight layout, launch plan, model and compile target; nvcc builds named
and sampled configurations for sm_90a with HGMMA instructions, without spills and without
wgmma serialization."""

from __future__ import annotations

import random
import sys
import types

import numpy as np
import pytest

import nmgen
from nmgen.build import nvrtc
from nmgen.families.mma import MMA
from nmgen.families.plan import Aligned16, Call, Device, Pointer, Scalar
from nmgen.families.registry import config_from_dict, config_from_name, serving
from nmgen.families.wgmma import WGMMA
from nmgen.families.wgmma.config import WgmmaConfig
from nmgen.families.wgmma.model import estimate, stage_mma_cycles, tensor_tflops
from nmgen.families.wgmma.prepare import prepare, stage_count
from nmgen.families.wgmma.render import min_blocks_per_sm
from nmgen.gpus import REGISTERS_PER_SM, Arch, gpu_spec
from nmgen.problem import ALayout, Problem
from nmgen.runtime.check import random_weight

H100 = gpu_spec("h100")
CONFIG = WgmmaConfig(8, 32, 128, bm=128, bn=128, windows=8, warpgroups=2, stages=4)
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


@pytest.mark.parametrize("change, rule", [
    (dict(dtype="f32"), "bf16 or f16"),
    (dict(arch="sm_80"), "arch sm_90"),
    (dict(a_layout="rm"), "K-major A"),
    (dict(bn=32), "one index set"),
    (dict(bn=256), "one index set"),  # L = 128
    (dict(windows=1), "whole k16 steps"),
    (dict(windows=32), "bk <= 128"),
    (dict(warpgroups=4, bm=256), "warpgroups <= 2"),
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


def test_serves_k_major_bf16_and_f16_with_long_vectors_on_sm90():
    assert WGMMA in serving(Problem(8, 32, 128, ALayout.K_MAJOR, dtype="bf16"))
    assert WGMMA in serving(Problem(2, 4, 64, ALayout.K_MAJOR, dtype="f16"))
    assert WGMMA.serves(Problem(8, 32, 128, ALayout.K_MAJOR)) is not None  # fp32
    assert "K-major" in WGMMA.serves(Problem(8, 32, 128, dtype="bf16"))
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
    rng = random.Random(0)
    for _ in range(20):
        config = WGMMA.space.sample(problem, rng)
        assert WGMMA.space.config(problem, WGMMA.space.values_of(config)) == config
        assert WgmmaConfig.from_name(config.name) == config


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
]


def check_resources(config: WgmmaConfig) -> None:
    from nmgen.build.nvcc import compile_with_nvcc

    compiled = compile_with_nvcc(nmgen.render(config))
    main = compiled.resources[config.name]
    assert main.spill_stores == 0 and main.spill_loads == 0, f"{config.name}: {main}"
    assert main.stack_bytes == 0, f"{config.name}: {main}"
    budget = min(255, REGISTERS_PER_SM // (config.threads * min_blocks_per_sm(config)))
    assert main.registers <= budget, f"{config.name}: {main.registers} > {budget}"
    assert "sm_90a" in compiled.log
    assert "serialized" not in compiled.log, compiled.log  # wgmmas kept in flight


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


@pytest.mark.nvcc
def test_the_kernel_is_hgmma_with_both_operands_transposed(tmp_path):
    """Where the CUDA disassembler is present: the main loop is HGMMA from two shared
    memory descriptors, MN-major (tnspA, tnspB)."""
    import shutil
    import subprocess

    from nmgen.build.nvcc import compile_with_nvcc

    disassembler = shutil.which("nvdisasm")
    if disassembler is None:
        pytest.skip("nvdisasm not found")
    cubin = compile_with_nvcc(nmgen.render(CONFIG)).path
    sass = subprocess.run([disassembler, "-c", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    hgmma = [line for line in sass.splitlines() if "HGMMA.64x128x16.F32.BF16" in line]
    assert len(hgmma) == CONFIG.bk // 16 * CONFIG.tiles_m
    assert all("tnspA.tnspB" in line for line in hgmma)
