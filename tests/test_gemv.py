"""The decode family (small M, memory-bound) on the CPU: its configurations, space, model,
weight layout and launch plan; every dtype renders and compiles (nvcc)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import nmgen
from nmgen.dispatch import Dispatcher
from nmgen.families.gemv import GEMV
from nmgen.families.gemv import config as config_module
from nmgen.families.gemv.config import GemvConfig
from nmgen.families.plan import Call, Device, Pointer
from nmgen.families.registry import serving
from nmgen.gpus import gpu_spec
from nmgen.problem import ALayout, Problem
from nmgen.runtime.device import DeviceInfo
from nmgen.store.database import connect
from nmgen.store.records import DeviceKey, ProblemKey, record_trial
from nmgen.store.tables import TrialStatus

H100 = gpu_spec("h100")
CONFIG = GemvConfig(8, 32, 128, rows=4, col_threads=64, lanes=2, cols=8, unroll=4,
                    split_k=2, dtype="bf16")


def test_name_states_every_parameter_and_round_trips():
    assert CONFIG.name == "nm_gemv_bf16_n8m32l128_r4_t64x2_c8_u4_k2_rm_sm90"
    assert GemvConfig.from_name(CONFIG.name) == CONFIG
    assert nmgen.families.registry.config_from_dict(CONFIG.to_dict()) == CONFIG
    assert nmgen.families.registry.config_from_name(CONFIG.name) == CONFIG


def test_prefetch_is_named_and_stored_only_where_it_is_not_the_default():
    ahead = CONFIG.replace(prefetch=2)
    assert ahead.name == "nm_gemv_bf16_n8m32l128_r4_t64x2_c8_u4_p2_k2_rm_sm90"
    assert GemvConfig.from_name(ahead.name) == ahead
    assert ahead.to_dict()["prefetch"] == 2
    assert GemvConfig.from_json(ahead.to_json()) == ahead
    assert "prefetch" not in CONFIG.to_dict() and "_p" not in CONFIG.name
    assert GemvConfig.from_dict({**CONFIG.to_dict(), "prefetch": 0}) == CONFIG
    with pytest.raises(nmgen.ConfigError, match="not a gemv kernel name"):
        GemvConfig.from_name("nm_gemv_bf16_n8m32l128_r4_t64x2_c8_u4_p0_k2_rm_sm90")


def test_wide_sum_is_named_stored_and_refines_split_k_winners():
    wide = CONFIG.replace(split_k=32, wide_sum=1)
    assert wide.name == "nm_gemv_bf16_n8m32l128_r4_t64x2_c8_u4_k32_wsum_rm_sm90"
    assert GemvConfig.from_name(wide.name) == wide
    assert GemvConfig.from_json(wide.to_json()) == wide
    assert "wide_sum" not in CONFIG.to_dict() and "wsum" not in CONFIG.name
    assert GEMV.refinements(CONFIG.replace(split_k=32)) == [wide]
    assert GEMV.refinements(CONFIG.replace(split_k=1)) == GEMV.refinements(wide) == []
    with pytest.raises(nmgen.ConfigError, match="wide_sum 0 or 1"):
        CONFIG.replace(wide_sum=2)


def test_wide_sum_batches_and_chunks():
    """A thread of r4 t64x2 c8 adds 16 outputs: wide, four (the batch) at a time with four
    slices of each loaded at once; of r1 t64x2 c4, two with eight slices each."""
    assert (CONFIG.sum_elements, CONFIG.sum_batch, CONFIG.sum_chunk) == (16, 4, 4)
    one = GemvConfig(8, 32, 128, rows=1, col_threads=64, lanes=2, cols=4, unroll=8,
                     split_k=32, dtype="bf16")
    assert (one.sum_elements, one.sum_batch, one.sum_chunk) == (2, 2, 8)
    assert one.sum_batch * one.sum_chunk == config_module.SUM_LOADS


def test_model_does_not_yet_tell_the_wide_sum_from_its_twin():
    """Unmeasured, the wide sum is estimated as its twin (``nmgen refine --min-gain 0``
    times it beside the tuned winners; dispatch's model choice stays the measured kind)."""
    one = GemvConfig(8, 32, 128, rows=1, col_threads=64, lanes=2, cols=4, unroll=8,
                     split_k=32, dtype="bf16")
    shape = (1, 4096, 4096)
    assert GEMV.estimate_ms(one, H100, shape) == GEMV.estimate_ms(one.replace(wide_sum=1),
                                                                  H100, shape)
    seeds = GEMV.seed_candidates(Problem(8, 32, 128, dtype="bf16"), GEMV.space)
    assert one in seeds and not any(c.wide_sum for c in seeds)


def test_prefetch_buffers_count_in_the_registers():
    """Each group ahead holds UNROLL rows' words and indices (bf16 COLS = 8: 4 words and 1
    index a row) and the ROWS A values of each index."""
    ahead = 4 * (4 + 1) + 4 * 1
    assert CONFIG.replace(prefetch=1).registers_estimate == CONFIG.registers_estimate + ahead
    assert CONFIG.replace(prefetch=2).registers_estimate == CONFIG.registers_estimate + 2 * ahead


# Source hashes (version line aside) of kernels the shipped records do not hold (K-major A,
# fp16, 2-byte loads), as the generator rendered them before prefetch: unchanged.
BEFORE_PREFETCH = {
    "nm_gemv_f16_n8m32l128_r2_t64x4_c4_u2_k8_km_sm90":
        "44b01b68ad0b23b5c81ebaecfe5d0eb72bf7d796a81506a9be9e4e8ae407119f",
    "nm_gemv_bf16_n16m32l128_r8_t32x2_c2_u2_k1_km_sm90":
        "d07f494ad9796f9f25622ed58decb9f7467fc562440fec21036b67677de27ea0",
    "nm_gemv_f32_n4m16l32_r1_t128x1_c4_u4_k4_km_sm80":
        "3fd48613c6bef15e666f31f74f9ece8e33b132efc75583c56c7653dd4653296e",
    "nm_gemv_f16_n2m4l16_r4_t64x2_c1_u8_k2_rm_sm90":
        "a6d84f2b260802aa2bbce1cd802d412c60de3b85801ebb3cc033a071624fc7a8",
}


@pytest.mark.parametrize("name", sorted(BEFORE_PREFETCH))
def test_kernels_without_prefetch_render_as_before_it(name):
    from nmgen.codegen import source_hash

    config = GemvConfig.from_name(name)
    assert source_hash(nmgen.render(config).code) == BEFORE_PREFETCH[name]
    assert source_hash(nmgen.render(config.replace(prefetch=1)).code) != BEFORE_PREFETCH[name]


def test_shipped_kernels_keep_their_names_parameters_and_source():
    """Every shipped gemv record: the configuration its parameters make has its name, its
    parameters and the source it was timed on."""
    import json
    import sqlite3

    from nmgen.codegen import source_hash
    from nmgen.store.database import shipped_db

    with sqlite3.connect(shipped_db()) as db:
        rows = db.execute("select name, params, source_hash from nm_kernel_configs "
                          "where name like 'nm_gemv_%'").fetchall()
    assert len(rows) > 1000
    for name, params, stored in rows:
        config = GemvConfig.from_dict(json.loads(params))
        assert (config.name, config.to_dict()) == (name, json.loads(params))
        assert source_hash(nmgen.render(config).code) == stored, name


@pytest.mark.parametrize("change, rule", [
    (dict(cols=16), "one load"), (dict(vec=12, cols=8), "share whole indices"),
    (dict(col_threads=48, lanes=1), "multiple of 32"), (dict(lanes=32), "at most 1024"),
    (dict(rows=64, cols=4), "accumulators"),
    (dict(m=256, rows=64, cols=2, col_threads=128, lanes=2, arch="sm_86"), "shared memory"),
    (dict(prefetch=3), "prefetch <= 2"), (dict(prefetch=-1), "0 <= prefetch"),
    (dict(rows=16, col_threads=32, lanes=1, unroll=8, prefetch=1), "a thread"),
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


def test_space_draws_every_prefetch_and_so_does_the_fuzz_test():
    from nmgen.bench.selftest import draw_config
    from nmgen.gpus import Arch

    problem = Problem(8, 32, 128, dtype="bf16")
    rng = random.Random(1)
    assert {GEMV.space.sample(problem, rng).prefetch for _ in range(60)} == {0, 1, 2}
    drawn = {draw_config(GEMV, rng, Arch.SM90, H100).prefetch for _ in range(60)}
    assert drawn == {0, 1, 2}
    configs = [GEMV.space.sample(problem, rng) for _ in range(60)]
    assert {c.wide_sum for c in configs} == {0, 1}
    assert all(c.split_k > 1 for c in configs if c.wide_sum)  # not its twin's kernel again
    assert {draw_config(GEMV, rng, Arch.SM90, H100).wide_sum for _ in range(60)} == {0, 1}


def test_model_counts_the_rows_loaded_ahead_where_a_lane_has_them():
    base = GemvConfig(8, 32, 128, rows=1, col_threads=64, lanes=1, cols=8, unroll=2,
                      split_k=8, dtype="bf16")
    shape = (1, 4096, 4096)  # 16 windows a slice: 128 rows a lane
    times = [GEMV.estimate_ms(base.replace(prefetch=p), H100, shape) for p in (0, 1, 2)]
    assert times[0] > times[1] > times[2]
    short = base.replace(unroll=8, lanes=4, split_k=32)  # one window a lane: 8 rows
    # nothing to load ahead: only the registers of the ring, which cost blocks an SM
    assert GEMV.estimate_ms(short.replace(prefetch=2), H100, shape) > \
        GEMV.estimate_ms(short, H100, shape)


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
    from nmgen.compiler.nvcc import compile_with_nvcc

    rng = random.Random(f"{dtype}-{layout.value}")
    for _ in range(2):
        config = GEMV.space.sample(Problem(4, 16, 16, layout, dtype=dtype), rng)
        for split in (1, 4):
            config = config.replace(split_k=split)
            compiled = compile_with_nvcc(nmgen.render(config))
            assert set(GEMV.entry_points(config)) <= set(compiled.resources), compiled.log
            assert all(r.spill_stores == 0 for r in compiled.resources.values())


# ptxas (CUDA 13.0, sm_90) registers without / with prefetch 1 / 2, no spills:
#   bf16 r1 t128x2 c8 u8 k8:  98 / 122 / 168    bf16 r4 t64x2 c8 u4 k2:  88 / 108 / 138
#   bf16 r1 t64x4 c8 u4 k16:  63 /  78 / 102    f32 r1 t128x2 c4 u8 k8:  64 / 114 / 157
#   f16 r2 t64x4 c4 u2 k8 km: 40 /  48 /  54
@pytest.mark.nvcc
@pytest.mark.parametrize("prefetch", [1, 2])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("layout", list(ALayout))
def test_prefetch_compiles_without_spills_for_every_dtype_and_layout(prefetch, dtype, layout):
    from nmgen.compiler.nvcc import compile_with_nvcc

    config = GemvConfig(8, 32, 128, rows=2, col_threads=64, lanes=2, cols=16 // 4, unroll=4,
                        split_k=4, prefetch=prefetch, a_layout=layout, dtype=dtype)
    widest = config.replace(cols=16 // config.dtype.itemsize, rows=1, unroll=8)
    for c in (config, widest, widest.replace(rows=8, lanes=1, unroll=4, split_k=1),
              widest.replace(wide_sum=1), config.replace(rows=8, lanes=1, wide_sum=1)):
        compiled = compile_with_nvcc(nmgen.render(c))
        (resources,) = compiled.resources.values()
        assert resources.spill_stores == resources.spill_loads == 0, compiled.log
        assert resources.stack_bytes == 0, compiled.log  # the ring stays in registers


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
        key = ProblemKey.of(problem, (rows, 4096, 4096),
                            DeviceKey("h100", device.name, 13000, 132), family)
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
    key = ProblemKey.of(problem, (64, 4096, 4096), DeviceKey("h100", device.name, 13000, 132),
                        GEMV)
    record_trial(engine, key, decode, "h", TrialStatus.OK, time_ms=0.02)
    dispatcher = Dispatcher([url], device=device)
    assert dispatcher.decide(problem, (32, 4096, 4096)).config == decode
    prefill = dispatcher.decide(problem, (2048, 4096, 4096))
    assert (prefill.source, prefill.config.family) == ("model", "wgmma")  # sm_90
