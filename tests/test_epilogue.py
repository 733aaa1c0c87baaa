"""Epilogues on the CPU: the tag and name of every family's configuration with one, its
JSON, rendering (a kernel without one keeps its source), the launch plans' bias argument,
dispatch's choice of the variant, the float64 reference; nvcc builds every family's
epilogue variants (required in CI). The GPU runs are tests/test_epilogue_gpu.py."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

import nmgen
from nmgen.dispatch import Dispatcher
from nmgen.epilogue import NO_EPILOGUE, Activation, Epilogue, apply_reference
from nmgen.families import registry
from nmgen.families.base import epilogue_of
from nmgen.families.f32_simt import F32_SIMT
from nmgen.families.gemv import GEMV
from nmgen.families.gemv.config import GemvConfig
from nmgen.families.mma import MMA
from nmgen.families.mma.config import MmaConfig
from nmgen.families.plan import Call, Device, Pointer
from nmgen.gpus import Arch
from nmgen.problem import ALayout, Problem
from nmgen.runtime.device import DeviceInfo
from nmgen.store.database import connect
from nmgen.store.records import DeviceKey, ProblemKey, record_trial
from nmgen.store.tables import TrialStatus

EPILOGUES = [Epilogue(bias, act) for bias in (False, True) for act in Activation
             if bias or act is not Activation.NONE]
TAGS = [e.tag for e in EPILOGUES]
GEMV_CONFIG = GemvConfig(8, 32, 128, rows=4, col_threads=64, lanes=2, cols=8, unroll=4,
                         split_k=2, dtype="bf16")
MMA_CONFIG = MmaConfig.from_name("nm_mma_bf16_n8m32l128_b128x128x32_w2x2_s3_rm_sm90")
F32_CONFIG = nmgen.KernelConfig(8, 32, 32, 64, 128, 64, 8, 8, a_layout="km")
CONFIGS = {"gemv": GEMV_CONFIG, "mma": MMA_CONFIG, "f32": F32_CONFIG}
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", 132, 9, 0, 13000)


def test_tags_name_each_epilogue_once_and_parse_back():
    assert TAGS == ["relu", "gelu", "gelu_tanh", "silu", "bias", "bias_relu", "bias_gelu",
                    "bias_gelu_tanh", "bias_silu"]
    for epilogue in EPILOGUES:
        assert Epilogue.parse(epilogue.tag) == epilogue and epilogue
        assert Epilogue.split_name("k_sm90" + epilogue.suffix) == ("k_sm90", epilogue)
    assert not NO_EPILOGUE and NO_EPILOGUE.suffix == "" and Epilogue.parse(None) == NO_EPILOGUE
    assert Epilogue.split_name("k_sm90") == ("k_sm90", NO_EPILOGUE)
    assert Epilogue(True, "silu").formula == "silu(x + bias[n])"
    for bad in ("tanh", "bias_", "_relu", "silu_bias", "none"):
        with pytest.raises(ValueError, match="expected one of"):
            Epilogue.parse(bad)
    with pytest.raises(ValueError, match="activation 'tanh'"):
        Epilogue(False, "tanh")


@pytest.mark.parametrize("family", list(CONFIGS))
@pytest.mark.parametrize("tag", TAGS)
def test_name_and_json_state_the_epilogue_and_round_trip(family, tag):
    plain = CONFIGS[family]
    config = dataclasses.replace(plain, epilogue=tag)
    assert config.name == f"{plain.name}_{tag}"
    assert config.to_dict() == {**plain.to_dict(), "epilogue": tag}
    assert registry.config_from_dict(config.to_dict()) == config
    assert registry.config_from_name(config.name) == config
    assert registry.family_of(config).with_epilogue(plain, Epilogue.parse(tag)) == config
    assert epilogue_of(config) == Epilogue.parse(tag)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_no_epilogue_leaves_name_and_json_as_they_were(family):
    config = CONFIGS[family]
    assert "epilogue" not in config.to_dict() and "epilogue" not in config.to_json()
    assert config.name == Epilogue.split_name(config.name)[0]
    assert dataclasses.replace(config, epilogue="") == config
    with pytest.raises(nmgen.ConfigError, match="expected one of"):
        registry.config_from_dict({**config.to_dict(), "epilogue": "tanh"})


def test_f32_replace_and_the_tma_twin_keep_the_epilogue():
    config = nmgen.KernelConfig(8, 32, 32, 128, 256, 64, 16, 8, stages=3, tma=True,
                                a_layout="km", epilogue="bias_gelu")
    assert config.replace(stages=2).epilogue == config.epilogue
    assert config.cp_async_twin().epilogue == config.epilogue


def test_a_family_without_an_epilogue_field_takes_none():
    from .naive_family import NAIVE, NaiveConfig

    assert NAIVE.with_epilogue(NaiveConfig(2, 4, 8, 128, 2), Epilogue(True)) is None
    assert epilogue_of(NaiveConfig(2, 4, 8, 128, 2)) == NO_EPILOGUE


# ------------------------------------------------------------------------ rendering
@pytest.mark.parametrize("family", list(CONFIGS))
def test_render_reads_the_epilogue_only_where_there_is_one(family):
    plain = nmgen.render(CONFIGS[family]).code
    assert "epilogue(" not in plain and "bias_t" not in plain and "bias" not in plain
    code = nmgen.render(dataclasses.replace(CONFIGS[family], epilogue="bias_gelu_tanh")).code
    assert "//   epilogue  = bias_gelu_tanh" in code
    assert "C[m][n] = gelu_tanh(x + bias[n])" in code
    assert "const bias_t* __restrict__ bias" in code and "tanhf(" in code
    silu = nmgen.render(dataclasses.replace(CONFIGS[family], epilogue="silu")).code
    assert "expf(-x)" in silu and "__ldg(bias + col)" not in silu


def test_f32_split_k_applies_the_epilogue_in_the_reduction_only():
    config = F32_CONFIG.replace(split_k=3, epilogue="bias_relu")
    code = nmgen.render(config).code
    main = code[code.index(f"{config.name}(const float*"):code.index(f"{config.name}_reduce")]
    main = main.replace(config.name, "")
    reduce = code[code.index(f"{config.name}_reduce"):]
    assert "epilogue(" not in main and "bias" not in main
    assert "C[r * ldc + col] = epilogue(sum, bias, static_cast<int>(col));" in reduce


def test_f32_stream_k_applies_the_epilogue_where_a_tile_is_finished():
    config = nmgen.KernelConfig.from_name(
        "nm_spmm_f32_n16m32l32_ms128ns256ks64_mt16nt8_w8x4_nopack_s2_k1_streamk_km_sm90_bias")
    code = nmgen.render(config).code
    piece = code[code.index("tile_piece(const float*"):code.index("// Stream-K persistent")]
    assert piece.index("store_partial(acc, sk, block);") < piece.index("epilogue(acc[i]")
    assert "first_peer, bias);" in code


# ------------------------------------------------------------------------ launch plans
def _pointers(launch) -> list[str]:
    return [a.buffer for a in launch.args if isinstance(a, Pointer)]


def test_plans_pass_the_bias_to_the_kernel_that_writes_c():
    b = nmgen.prune(np.ones((512, 640), np.float32), "8:32", 128, dtype="bf16")
    call, device = Call(3, 512, True), Device(132, lambda entry, threads, smem: 1)
    for config in (GEMV_CONFIG, MMA_CONFIG):
        family = registry.family_of(config)
        variant = dataclasses.replace(config, epilogue="relu")
        prepared = family.prepare(b, config)
        (launch,) = family.plan(variant, prepared, b.shape, call, device).launches
        assert _pointers(launch)[-1] == "bias"
        (plain,) = family.plan(config, prepared, b.shape, call, device).launches
        assert "bias" not in _pointers(plain) and len(plain.args) == len(launch.args) - 1
    w = nmgen.prune(np.ones((512, 640), np.float32), "8:32", 32)
    for config in (F32_CONFIG, F32_CONFIG.replace(split_k=2),
                   F32_CONFIG.replace(stream_k=True),
                   F32_CONFIG.replace(a_tile="tx", a_layout="rm", split_k=3)):
        variant = config.replace(epilogue="bias")
        plan = F32_SIMT.plan(variant, F32_SIMT.prepare(w, variant), w.shape, call, device)
        takes = {launch.entry for launch in plan.launches if "bias" in _pointers(launch)}
        assert takes == {variant.name + ("_reduce" if config.split_k > 1 else "")}


# ------------------------------------------------------------------------ dispatch
def test_dispatch_takes_the_tuned_configuration_with_the_epilogue(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    key = ProblemKey.of(Problem(8, 32, 128, dtype="bf16"), (1, 4096, 4096),
                        DeviceKey("h100", H100.name, 13000, 132), GEMV)
    record_trial(connect(url), key, GEMV_CONFIG, "h", TrialStatus.OK, time_ms=0.02)
    dispatcher = Dispatcher([url], device=H100)
    problem = Problem(8, 32, 128, dtype="bf16")
    plain = dispatcher.decide(problem, (1, 4096, 4096))
    fused = dispatcher.decide(problem, (1, 4096, 4096), Epilogue(True, "silu"))
    assert (plain.source, plain.config) == ("exact", GEMV_CONFIG)
    assert (fused.source, fused.time_ms) == ("exact", 0.02)
    assert fused.config == dataclasses.replace(GEMV_CONFIG, epilogue="bias_silu")
    assert dispatcher.decide(problem, (1, 4096, 4096), Epilogue(True, "silu")) is fused
    prefill = dispatcher.decide(problem, (2048, 4096, 4096), Epilogue(False, "gelu"))
    # The model's tensor-core choice on sm_90: wgmma (row-major A through its K-major copy).
    assert prefill.config.family == "wgmma" and prefill.config.name.endswith("_sm90a_gelu")


def test_dispatch_passes_over_a_family_that_takes_no_epilogue(tmp_path):
    """The naive plugin family holds the exact record but takes no epilogue: a call with a
    bias runs the next decision, the FP32 family's model choice, with it."""
    from .naive_family import NAIVE, NaiveConfig

    registry.register(NAIVE)
    try:
        url = f"sqlite:///{tmp_path / 'tuned.db'}"
        key = ProblemKey.of(Problem(2, 4, 8), (96, 80, 72),
                            DeviceKey("h100", H100.name, 13000, 132), NAIVE)
        record_trial(connect(url), key, NaiveConfig(2, 4, 8, 128, 2), "h", TrialStatus.OK,
                     time_ms=0.01)
        dispatcher = Dispatcher([url], device=H100)
        problem = Problem(2, 4, 8)
        assert dispatcher.decide(problem, (96, 80, 72)).config.family == "naive"
        fused = dispatcher.decide(problem, (96, 80, 72), Epilogue(True))
        assert fused.config.family != "naive" and fused.config.epilogue == Epilogue(True)
    finally:
        registry.unregister(NAIVE.name)


# ------------------------------------------------------------------------ reference
def test_reference_adds_the_bias_and_applies_the_activation_in_float64():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    b = nmgen.prune(rng.standard_normal((70, 45)), "2:4", 8)
    a = rng.standard_normal((6, 70)).astype(np.float32)
    bias = rng.standard_normal(45).astype(np.float32)
    x = torch.from_numpy(nmgen.reference(a, b)) + torch.from_numpy(bias).double()
    expected = {"relu": torch.relu(x), "gelu": torch.nn.functional.gelu(x),
                "gelu_tanh": torch.nn.functional.gelu(x, approximate="tanh"),
                "silu": torch.nn.functional.silu(x), None: x}
    for activation, want in expected.items():
        got = nmgen.reference(a, b, bias, activation)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-13, atol=1e-13)
    relu_only = apply_reference(nmgen.reference(a, b), None, "relu")
    assert (relu_only >= 0).all() and relu_only.dtype == np.float64
    with pytest.raises(ValueError, match="bias has shape"):
        nmgen.reference(a, b, bias[:44])


# ------------------------------------------------------------------------ nvcc
def nvcc_variants() -> list:
    """Every epilogue on a random configuration of each family (f32: one of split-K,
    stream-K, sliced K, TMA and the copied A tile, in turn)."""
    rng = random.Random(11)
    f32_paths = [dict(split_k=3), dict(stream_k=True), dict(slice_k=2), dict(tma=True),
                 dict(a_layout="rm", a_tile="tx")]
    variants = []
    for i, epilogue in enumerate(EPILOGUES):
        for family in (GEMV, MMA):
            dtype = sorted(family.dtypes, key=lambda d: d.value)[i % len(family.dtypes)]
            problem = Problem(8, 32, 128, list(ALayout)[i % 2], Arch.SM90, dtype)
            config = family.space.sample(problem, rng, max_tries=300)
            variants.append(family.with_epilogue(config, epilogue))
        base = nmgen.KernelConfig(8, 32, 32, 64, 128, 64, 8, 8, a_layout="km")
        variants.append(base.replace(**f32_paths[i % len(f32_paths)], epilogue=epilogue.tag))
    return variants


@pytest.mark.nvcc
@pytest.mark.parametrize("config", nvcc_variants(), ids=lambda c: c.name)
def test_epilogue_variants_compile_without_spills(config):
    from nmgen.compiler.nvcc import compile_with_nvcc

    compiled = compile_with_nvcc(nmgen.render(config))
    assert set(registry.family_of(config).entry_points(config)) <= set(compiled.resources), \
        compiled.log
    for entry, res in compiled.resources.items():
        assert res.spill_stores == 0 and res.spill_loads == 0, f"{entry}: {res}"
        assert res.registers <= 255
