"""The decode family (small M, memory-bound) on the CPU: its configurations, space, model,
weight layout and launch plan; every dtype renders and compiles (nvcc)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import nmgen
from nmgen.dispatch import Dispatcher
from nmgen.families.gemv import GEMV
from nmgen.families.gemv.config import GemvConfig
from nmgen.families.plan import Call, Device, Pointer
from nmgen.families.registry import serving
from nmgen.gpus import gpu_spec
from nmgen.problem import ALayout, Problem
from nmgen.runtime.device import DeviceInfo
from nmgen.store.database import connect
from nmgen.store.records import ProblemKey, record_trial
from nmgen.store.tables import TrialStatus

H100 = gpu_spec("h100")
CONFIG = GemvConfig(8, 32, 128, rows=4, col_threads=64, lanes=2, cols=8, unroll=4,
                    split_k=2, dtype="bf16")


def test_name_states_every_parameter_and_round_trips():
    assert CONFIG.name == "nm_gemv_bf16_n8m32l128_r4_t64x2_c8_u4_k2_rm_sm90"
    assert GemvConfig.from_name(CONFIG.name) == CONFIG
    assert nmgen.families.registry.config_from_dict(CONFIG.to_dict()) == CONFIG
    assert nmgen.families.registry.config_from_name(CONFIG.name) == CONFIG


@pytest.mark.parametrize("change, rule", [
    (dict(cols=16), "one load"), (dict(vec=12, cols=8), "share whole indices"),
    (dict(col_threads=48, lanes=1), "multiple of 32"), (dict(lanes=32), "at most 1024"),
    (dict(rows=64, cols=4), "accumulators"),
    (dict(m=256, rows=64, cols=2, col_threads=128, lanes=2, arch="sm_86"), "shared memory"),
])
def test_rules_name_what_they_need(change, rule):
    values = {**CONFIG.to_dict(), **change}
    values.pop("family")
    with pytest.raises(nmgen.ConfigError, match=rule):
        GemvConfig(**values)


def test_serves_every_dtype_beside_the_fp32_family():
    assert GEMV in serving(Problem(2, 4, 16, dtype="bf16"))
    assert {f.name for f in serving(Problem(2, 4, 16))} == {"f32", "gemv"}


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_space_holds_a_load_of_whole_bytes_for_each_dtype(dtype):
    problem = Problem(8, 32, 128, dtype=dtype)
    configs = GEMV.seed_candidates(problem, GEMV.space)
    assert len(configs) > 1000
    assert {c.load_bytes for c in configs} <= {2, 4, 8, 16}
    rng = random.Random(0)
    for _ in range(20):
        config = GEMV.space.sample(problem, rng)
        assert GEMV.space.config(problem, GEMV.space.values_of(config)) == config


def test_model_splits_k_where_columns_are_few_and_is_near_the_memory_floor():
    problem = Problem(8, 32, 128, dtype="bf16")
    ranked = GEMV.ranker(GEMV.seed_candidates(problem, GEMV.space), H100).rank(1, 8192, 22016)
    best_ms, best = ranked[0]
    floor_ms = (22016 // 4 * 8192 * 2) / (H100.dram_gbs * 1e9) * 1e3  # the values alone
    assert best.split_k > 1 and best.rows == 1
    assert floor_ms < best_ms < 2 * floor_ms + 0.006  # two launches beside the floor
    single = best.replace(split_k=1)
    assert GEMV.estimate_ms(single, H100, (1, 8192, 22016)) > best_ms


def test_layout_pads_to_whole_loads():
    w = np.random.default_rng(0).standard_normal((300, 50)).astype(np.float32)
    b = nmgen.prune(w, "8:32", 2)
    config = GemvConfig(8, 32, 2, rows=1, col_threads=64, lanes=1, cols=4, unroll=2)
    prepared = GEMV.prepare(b, config)
    values, indices = prepared.arrays["values"], prepared.arrays["indices"]
    assert values.shape == (80, 52) and indices.shape == (80, 26)  # columns to 4s
    assert np.array_equal(values[:, :50], b.values) and not values[:, 50:].any()
    assert np.array_equal(indices[:, :25], b.indices)
    assert (indices[:, 25] == np.arange(80) % 8).all()


def test_plan_is_plain_data_with_the_split_summed_in_one_launch():
    b = nmgen.prune(np.ones((512, 640), np.float32), "8:32", 128, dtype="bf16")
    prepared = GEMV.prepare(b, CONFIG)
    plan = GEMV.plan(CONFIG, prepared, b.shape, Call(3, 512, True), Device(132, None))
    (main,) = plan.launches  # the tile's last block adds the slices: one launch
    assert main.grid == (2, 1, 2) and main.threads == 128  # 640 columns of 512 a block
    assert main.smem == 4 * (4 * 8 * 32 + 4 * 8 * 64)  # A slice of 8 windows; lanes' sums
    assert [a.buffer for a in main.args if isinstance(a, Pointer)] == [
        "a", "values", "indices", "c", "split_sums", "tile_counters"]
    assert [(w.name, w.count, w.persistent) for w in plan.workspaces] == [
        ("split_sums", 2 * 3 * 640, False), ("tile_counters", 2, True)]


@pytest.mark.nvcc
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("layout", list(ALayout))
def test_every_dtype_and_layout_compiles_without_spills(dtype, layout):
    from nmgen.build.nvcc import compile_with_nvcc

    rng = random.Random(f"{dtype}-{layout.value}")
    for _ in range(2):
        config = GEMV.space.sample(Problem(4, 16, 16, layout, dtype=dtype), rng)
        for split in (1, 4):
            config = config.replace(split_k=split)
            compiled = compile_with_nvcc(nmgen.render(config))
            assert set(GEMV.entry_points(config)) <= set(compiled.resources), compiled.log
            assert all(r.spill_stores == 0 for r in compiled.resources.values())


def test_dispatch_takes_each_family_where_its_records_are(tmp_path):
    """Decode records at M = 1, FP32 ones at M = 1024: each M gets its family."""
    from nmgen.families.f32_simt import F32_SIMT

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    engine = connect(url)
    device = DeviceInfo("NVIDIA H100 80GB HBM3", 132, 9, 0, 13000)
    problem = Problem(8, 32, 32)
    small = GemvConfig(8, 32, 32, rows=1, col_threads=128, lanes=2, cols=4, unroll=4,
                       split_k=8)
    large = F32_SIMT.reference_config(problem)
    for family, config, rows, ms in ((GEMV, small, 1, 0.02), (F32_SIMT, large, 1024, 0.5)):
        key = ProblemKey("h100", device.name, "sm_90", 13000, 132, family.generator_hash(),
                         8, 32, 32, "f32", "rm", rows, 4096, 4096)
        record_trial(engine, key, config, "h", TrialStatus.OK, time_ms=ms)
    dispatcher = Dispatcher([url], device=device)
    assert dispatcher.decide(problem, (1, 4096, 4096)).config == small
    assert dispatcher.decide(problem, (2, 4096, 4096)).config == small  # nearest: decode's
    assert dispatcher.decide(problem, (1024, 4096, 4096)).config == large
    assert dispatcher.decide(problem, (2048, 4096, 4096)).config == large


def test_decode_records_are_not_stretched_to_prefill(tmp_path):
    """bf16 with decode records only (M = 64): M = 32 takes the nearest decode record,
    M = 2048 the tensor-core family's model choice, not a decode kernel."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    engine = connect(url)
    device = DeviceInfo("NVIDIA H100 80GB HBM3", 132, 9, 0, 13000)
    problem = Problem(8, 32, 128, dtype="bf16")
    decode = GemvConfig(8, 32, 128, rows=16, col_threads=64, lanes=4, cols=8, unroll=8,
                        split_k=4, dtype="bf16")
    key = ProblemKey("h100", device.name, "sm_90", 13000, 132, GEMV.generator_hash(),
                     8, 32, 128, "bf16", "rm", 64, 4096, 4096)
    record_trial(engine, key, decode, "h", TrialStatus.OK, time_ms=0.02)
    dispatcher = Dispatcher([url], device=device)
    assert dispatcher.decide(problem, (32, 4096, 4096)).config == decode
    prefill = dispatcher.decide(problem, (2048, 4096, 4096))
    assert (prefill.source, prefill.config.family) == ("model", "mma")
