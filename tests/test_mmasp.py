"""The ``mma.sp`` family (CPU): names, rules, which problems it serves, its weight layout
(the ``sptc`` family's), its launch plan, its model, and nvcc builds of named
configurations for sm_80, sm_86, sm_89 and sm_90 without spills."""

from __future__ import annotations

import numpy as np
import pytest

import nmgen
from nmgen.families.mmasp import MMASP
from nmgen.families.mmasp.config import MmaSpConfig
from nmgen.families.mmasp.launch import SPLIT_SUMS, TILE_COUNTERS, slicing
from nmgen.families.mmasp.render import min_blocks_per_sm
from nmgen.families.plan import Aligned16, Call, Device
from nmgen.families.registry import config_from_name, serving
from nmgen.families.space import ConfigError
from nmgen.families.sptc import SPTC
from nmgen.format import DType
from nmgen.gpus import REGISTERS_PER_SM, Arch, gpu_spec
from nmgen.problem import ALayout, Problem
from nmgen.runtime.check import random_weight

CONFIG = MmaSpConfig.from_name("nm_mmasp_bf16_n2m4l1_b128x64x128_w2x2_s3_k1_rm_sm80")
DEVICE = Device(108, lambda entry, threads, smem: 2)
A100 = gpu_spec("a100")


def test_name_states_every_parameter_and_round_trips():
    assert (CONFIG.bm, CONFIG.bn, CONFIG.warps_m, CONFIG.warps_n, CONFIG.stages,
            CONFIG.split_k) == (128, 64, 2, 2, 3, 1)
    assert CONFIG.arch is Arch.SM80 and CONFIG.dtype is DType.BF16
    for config in (CONFIG, CONFIG.replace(dtype=DType.F16, a_layout=ALayout.K_MAJOR,
                                          arch=Arch.SM89, split_k=4, stages=2,
                                          epilogue="bias_gelu")):
        assert MmaSpConfig.from_name(config.name) == config
        assert config_from_name(config.name) == config
        assert MmaSpConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(("changes", "rule"), [
    ({"warps_m": 1, "warps_n": 1, "bm": 64, "bn": 16}, "threads"),
    ({"bm": 64, "warps_m": 1, "bn": 128, "warps_n": 2}, "accumulators"),
    ({"bn": 16, "warps_n": 4}, r"bn = 8 \* warps_n"),
    ({"bm": 96}, "bm in"),
    ({"n": 3, "m": 4}, "fit 2:4"),
    ({"dtype": DType.F32}, "bf16 or f16"),
    ({"stages": 7}, "stages"),
])
def test_rules_name_what_breaks(changes, rule):
    with pytest.raises(ConfigError, match=rule):
        CONFIG.replace(**changes)


def test_serves_patterns_that_fit_2of4_below_sm90_and_leaves_sm90_to_sptc():
    for arch in (Arch.SM80, Arch.SM86, Arch.SM89):
        for n, m, vec in ((2, 4, 1), (1, 4, 1), (1, 2, 1), (2, 8, 16), (2, 4, 128)):
            assert MMASP.serves(Problem(n, m, vec, arch=arch, dtype=DType.BF16)) is None
    sm90 = Problem(2, 4, 1, arch=Arch.SM90, dtype=DType.BF16)
    assert "sptc" in MMASP.serves(sm90)
    assert "mmasp" not in {f.name for f in serving(sm90)}
    assert "sptc" in {f.name for f in serving(sm90)}
    assert "2:4" in MMASP.serves(Problem(4, 8, 1, arch=Arch.SM80, dtype=DType.BF16))
    assert "bf16" in MMASP.serves(Problem(2, 4, 1, arch=Arch.SM80))  # FP32
    sm80 = Problem(2, 4, 1, arch=Arch.SM80, dtype=DType.BF16)
    assert "mmasp" in {f.name for f in serving(sm80)}
    assert "sptc" not in {f.name for f in serving(sm80)}  # wgmma.sp: sm_90 only


def test_the_weight_layout_is_the_sptc_familys_one():
    """One device layout serves both sparse-tensor-core families (prepared once)."""
    assert MMASP.module("prepare") is SPTC.module("prepare")
    sptc = SPTC.default_config(Problem(2, 4, 1, dtype=DType.BF16), gpu_spec("h100"),
                               (64, 512, 512))
    assert MMASP.layout_key(CONFIG) == SPTC.layout_key(sptc)


def test_the_launch_reads_a_in_chunks_where_it_can_and_slices_sum_in_a_workspace():
    weight = random_weight(np.random.default_rng(1), 2, 4, 1, 1000, 300, dtype=DType.BF16)
    prepared = MMASP.prepare(weight, CONFIG)
    plan = MMASP.plan(CONFIG, prepared, weight.shape, Call(50, 1000, True), DEVICE)
    (launch,) = plan.launches
    assert launch.grid == (3, 1, 1) and launch.smem == CONFIG.smem_bytes
    assert not plan.workspaces
    chunks = [a for a in launch.args if isinstance(a, Aligned16) and a.buffer == "a"]
    assert chunks[0].allowed
    odd = MMASP.plan(CONFIG, prepared, weight.shape, Call(50, 1001, True), DEVICE)
    assert not [a for a in odd.launches[0].args if isinstance(a, Aligned16)][0].allowed
    k_major = CONFIG.replace(a_layout=ALayout.K_MAJOR)
    plan_km = MMASP.plan(k_major, prepared, weight.shape, Call(50, 64, True), DEVICE)
    assert not [a for a in plan_km.launches[0].args if isinstance(a, Aligned16)][0].allowed
    sliced = CONFIG.replace(split_k=16, bn=8, warps_n=1)
    assert slicing(sliced, 1000) == (8, 1, 8)
    plan = MMASP.plan(sliced, prepared, weight.shape, Call(1, 1000, True), DEVICE)
    assert plan.launches[0].grid == (3, 1, 8)
    assert {w.name for w in plan.workspaces} == {SPLIT_SUMS, TILE_COUNTERS}


def test_the_model_is_no_faster_than_the_sparse_ideal_and_picks_by_regime():
    """On an A100: a prefill estimate between the 2x of the sparse instructions and dense
    mma.sync time, the weight's bytes at decode, slices of K for a decode shape of few
    column blocks; a config compiled for sm_90 is refused there."""
    problem = Problem(2, 4, 1, arch=Arch.SM80, dtype=DType.BF16)
    m, n, k = 4096, 4096, 4096
    dense_ms = 2 * m * n * k / 312e12 * 1e3
    prefill = MMASP.default_config(problem, A100, (m, n, k))
    estimate = MMASP.estimate_ms(prefill, A100, (m, n, k))
    assert dense_ms / 2 < estimate < dense_ms
    assert prefill.bm * prefill.bn >= 64 * 64
    decode = MMASP.default_config(problem, A100, (1, 2048, 8192))
    weight_ms = 2048 * 8192 * 1.125 / (A100.dram_gbs * 1e6)  # values and metadata
    assert MMASP.estimate_ms(decode, A100, (1, 2048, 8192)) > weight_ms
    assert decode.bn <= 16 and decode.split_k > 1
    assert MMASP.feasible(decode.replace(arch=Arch.SM90), A100) is not None


NVCC_CONFIGS = [CONFIG.name,
                "nm_mmasp_f16_n2m4l1_b128x128x128_w2x4_s2_k1_rm_sm80",
                "nm_mmasp_bf16_n2m4l1_b64x8x128_w4x1_s4_k8_rm_sm80",  # decode, slices of K
                "nm_mmasp_bf16_n2m4l1_b256x8x128_w4x1_s2_k16_rm_sm86",
                "nm_mmasp_bf16_n2m4l1_b64x32x128_w2x2_s4_k2_km_sm89",  # K-major A
                "nm_mmasp_bf16_n2m4l128_b256x64x128_w4x2_s3_k1_rm_sm90_bias_silu"]


@pytest.mark.nvcc
@pytest.mark.parametrize("name", NVCC_CONFIGS)
def test_named_configurations_compile_without_spills(name):
    from nmgen.compiler.nvcc import compile_with_nvcc

    config = MmaSpConfig.from_name(name)
    compiled = compile_with_nvcc(nmgen.render(config))
    main = compiled.resources[config.name]
    assert main.spill_stores == 0 and main.spill_loads == 0, f"{name}: {main}"
    assert main.stack_bytes == 0 and main.static_smem == 0, f"{name}: {main}"
    assert main.registers <= min(255, REGISTERS_PER_SM // (config.threads
                                                           * min_blocks_per_sm(config)))
    ptx = compile_with_nvcc(nmgen.render(config), output="ptx").path.read_text()
    assert "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32" in ptx
