"""`nmgen bench` on the GPU: a small run end to end, and the dense baselines it times
compute the right product."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from nmgen.families.f32_simt.space import core_config
from nmgen.families.registry import config_from_name
from nmgen.gpus import Arch
from nmgen.problem import ALayout, Problem

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kind, rtol", [("sgemm", 1e-5), ("tf32", 5e-3), ("bf16", 2e-2),
                                        ("f16", 2e-3)])
def test_dense_baselines_are_right(kind, rtol):
    import cupy as cp

    from nmgen.bench.dense import Dense, dense_gemm

    rng = np.random.default_rng()
    a = rng.standard_normal((77, 256), dtype=np.float32)
    w = rng.standard_normal((256, 130), dtype=np.float32)
    out = dense_gemm(Dense(kind), cp.asarray(a), cp.asarray(w))()
    ref = a.astype(np.float64) @ w
    err = np.linalg.norm(cp.asnumpy(out) - ref) / np.linalg.norm(ref)
    assert err < rtol, err


@pytest.mark.parametrize("kind, rtol", [("bf16", 2e-2), ("f16", 2e-3)])
def test_16_bit_baselines_write_their_own_dtype(kind, rtol):
    """``same_dtype_out``: C in the inputs' dtype (BF16 as uint16 bits), as nmgen's
    kernels of that dtype write it."""
    import cupy as cp

    from nmgen.bench.dense import Dense, dense_gemm

    rng = np.random.default_rng()
    a = rng.standard_normal((77, 256), dtype=np.float32)
    w = rng.standard_normal((256, 130), dtype=np.float32)
    out = dense_gemm(Dense(kind), cp.asarray(a), cp.asarray(w), same_dtype_out=True)()
    assert out.dtype == (cp.uint16 if kind == "bf16" else cp.float16)
    if kind == "bf16":
        out = (out.astype(cp.uint32) << 16).view(cp.float32)
    ref = a.astype(np.float64) @ w
    err = np.linalg.norm(cp.asnumpy(out).astype(np.float64) - ref) / np.linalg.norm(ref)
    assert err < rtol, err


def test_small_bench_run(tmp_path):
    from nmgen.store.database import connect
    from nmgen.store.records import latest_ceilings

    shapes = tmp_path / "shapes.txt"
    shapes.write_text("33 256 512\n256 512 1024\n")
    db = f"sqlite:///{tmp_path / 'tuned.db'}"
    out = tmp_path / "bench"
    result = subprocess.run([sys.executable, "-m", "nmgen.cli", "bench", "--shapes",
                             str(shapes), "--pattern", "8:32,4:32", "--vec", "32", "--db", db,
                             "--out", str(out), "--repeat", "5"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with (out / "bench.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["pattern"], r["M"]) for r in rows] == [("8:32", "33"), ("8:32", "256"),
                                                      ("4:32", "33"), ("4:32", "256")]
    assert all(float(r["rel_error"]) < 1e-5 and float(r["nmgen_ms"]) > 0 for r in rows)
    # The core benchmark's hand-picked kernel is checked and timed on every shape too.
    for r in rows:
        n, m = (int(x) for x in r["pattern"].split(":"))
        core = core_config(Problem(n, m, 32, ALayout.ROW_MAJOR, Arch.SM90))
        assert float(r["core_ms"]) > 0 and r["core_config"] == core.name, r
    record = json.loads((out / "bench.json").read_text())
    assert record["ceilings"]["fp32_tflops"] > 5 and record["ceilings"]["dram_gbs"] > 300
    stored = latest_ceilings(connect(db), record["gpu"])
    assert stored is not None and stored.fp32_tflops == record["ceilings"]["fp32_tflops"]
    for name in ("bench.md", "speedup.png", "roofline.png", "model.png"):
        assert (out / name).stat().st_size > 0
    assert "geomean speedup" in result.stdout


def test_bench_k_major_a(tmp_path):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("17 256 512\n")
    out = tmp_path / "bench"
    result = subprocess.run([sys.executable, "-m", "nmgen.cli", "bench", "--shapes",
                             str(shapes), "--pattern", "8:32", "--vec", "32", "--layout", "km",
                             "--db", f"sqlite:///{tmp_path / 'tuned.db'}", "--out", str(out),
                             "--repeat", "3", "--no-plots"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with (out / "bench.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["rel_error"]) < 1e-5 and float(row["nmgen_ms"]) > 0
    for name in (row["config"], row["core_config"]):  # dispatch's pick: of any family
        assert config_from_name(name).a_layout is ALayout.K_MAJOR, name
    assert json.loads((out / "bench.json").read_text())["a_layout"] == "km"


def test_bench_check_densifies_exactly():
    import cupy as cp

    import nmgen
    from nmgen.bench.run import dense_float64, random_weight

    rng = np.random.default_rng()
    b = nmgen.prune(rng.standard_normal((75, 100), dtype=np.float32), "3:8", 16)
    assert np.array_equal(cp.asnumpy(dense_float64(b)), b.to_dense().astype(np.float64))
    w = random_weight(2, 8, 32, 99, 70)  # odd K and N: padding inside, invisible outside
    assert w.shape == (99, 70) and np.array_equal(cp.asnumpy(dense_float64(w)),
                                                  w.to_dense().astype(np.float64))


def test_decode_bench_rows_are_checked_and_complete():
    """`nmgen bench --decode` on two weights, two M each: every row checked against the
    float64 product, both baselines timed, 2:4 bf16 beside the semi-structured path."""
    pytest.importorskip("torch")
    from nmgen.bench.decode import run_decode_bench
    from nmgen.dispatch import Dispatcher
    from nmgen.format import DType, Pattern

    shapes = [(1, 256, 512), (5, 256, 512), (3, 384, 200), (1, 384, 200)]
    rows = run_decode_bench(shapes, [Pattern(2, 4)], 32, DType.BF16,
                            Dispatcher([]), repeat=3,
                            log=lambda s: None)
    assert [(r.M, r.N, r.K) for r in rows] == shapes
    for row in rows:
        assert row.rel_error < 2e-2 and row.nmgen_ms > 0 and row.baseline_ms > 0
        assert row.dtype == "bf16" and row.pattern == "2:4"
    assert any(r.semi_ms for r in rows)  # cuSPARSELt runs 2:4 at 16 bits here


def test_bf16_bench_of_prefill_sizes_takes_both_layouts():
    """`nmgen bench --dtype bf16` past decode sizes: rows checked, K-major A labelled."""
    pytest.importorskip("torch")
    from nmgen.bench.decode import run_decode_bench
    from nmgen.dispatch import Dispatcher
    from nmgen.format import DType, Pattern
    from nmgen.problem import ALayout

    shapes = [(300, 256, 512), (129, 200, 384)]
    for layout in ALayout:
        rows = run_decode_bench(shapes, [Pattern(8, 32)], 128, DType.BF16, Dispatcher([]),
                                repeat=3, log=lambda s: None, layout=layout)
        assert [(r.M, r.N, r.K) for r in rows] == shapes
        for row in rows:
            assert row.layout == layout.value and row.rel_error < 2e-2
            assert row.nmgen_ms > 0 and row.baseline_ms > 0 and row.semi_ms is None


@pytest.mark.parametrize("layout", list(ALayout))
def test_bf16_untuned_bench_run(tmp_path, layout):
    """`nmgen bench-untuned --dtype bf16` on two small shapes: the model's choice from an
    empty database and the exact record of a tuned one, each checked against float64 of
    the rounded inputs (the run stops at a wrong kernel), timed beside cuBLAS's BF16 GEMM."""
    pytest.importorskip("torch")
    from nmgen.bench.untuned import read_csv
    from nmgen.dispatch import Dispatcher, problem_key
    from nmgen.families.registry import config_from_name, family_of
    from nmgen.format import DType
    from nmgen.runtime.device import device_info
    from nmgen.store.database import connect
    from nmgen.store.records import record_trial
    from nmgen.store.tables import TrialStatus

    info = device_info()
    shapes = [(64, 256, 512), (129, 200, 384)]
    empty, tuned = (f"sqlite:///{tmp_path / name}" for name in ("empty.db", "tuned.db"))
    connect(empty)
    model = Dispatcher([empty], device=info, write_url="")
    problem = Problem(2, 4, 32, layout, info.arch, DType.BF16)
    recorded = {}
    for shape in shapes:  # the last quick candidate: another kernel than the model's
        config = model.quick_candidates(problem, shape)[-1]
        recorded[shape] = config.name
        record_trial(connect(tuned), problem_key(family_of(config), problem, shape, info),
                     config, "h", TrialStatus.OK, time_ms=1.0)
    shapes_file = tmp_path / "shapes.txt"
    shapes_file.write_text("".join(f"{m} {n} {k}\n" for m, n, k in shapes))
    out = tmp_path / "untuned"
    result = subprocess.run([sys.executable, "-m", "nmgen.cli", "bench-untuned", "--shapes",
                             str(shapes_file), "--problems", "2:4/32", "--dtype", "bf16",
                             "--layout", layout.value, "--tuned-db", tuned, "--untuned-db",
                             empty, "--out", str(out), "--repeat", "4", "--quiet"],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_csv(out / "untuned.csv")
    assert [(r.M, r.N, r.K) for r in rows] == shapes
    for r in rows:
        assert (r.pattern, r.vec, r.dtype, r.untuned_source) == ("2:4", 32, "bf16", "model")
        assert all(0 < ms < 100 for ms in (r.untuned_ms, r.tuned_ms, r.dense_ms)), r
        assert r.tuned_config == recorded[(r.M, r.N, r.K)] and r.quick_ms is None
        untuned = config_from_name(r.untuned_config)
        assert untuned.dtype is DType.BF16 and untuned.a_layout is layout, r
    record = json.loads((out / "untuned.json").read_text())
    assert record["dtype"] == "bf16" and record["dense"] == "cuBLAS BF16 GEMM"
    assert "| 2:4 | 32 | bf16 | 2 |" in (out / "untuned.md").read_text()
    assert not (out / "untuned.partial.csv").exists()


def test_rotated_copies_get_device_buffers_of_their_own_from_one_layout():
    """The decode bench's copies of a weight: ``upload_layouts`` gives each its own device
    buffers of the layout prepared once (the same host arrays, equal contents)."""
    import dataclasses

    import cupy as cp

    from nmgen.families.sptc.config import SptcConfig
    from nmgen.format import DType
    from nmgen.runtime.check import random_weight
    from nmgen.runtime.launch import device_weight, upload_layouts

    config = SptcConfig.from_name("nm_sptc_bf16_n2m4l1_b128x16x128_g1_s8_k1_rm_sm90a")
    first = random_weight(np.random.default_rng(), 2, 4, 1, 300, 200, dtype=DType.BF16)
    weight, host = device_weight(first, config)
    copy = dataclasses.replace(first, _prepared={})
    upload_layouts(first, copy)
    copied, copied_host = device_weight(copy, config)  # found, not prepared again
    assert copied_host is host and set(copied.arrays) == set(weight.arrays)
    for name, array in weight.arrays.items():
        assert copied.arrays[name].data.ptr != array.data.ptr
        assert bool(cp.array_equal(copied.arrays[name], array)), name
