"""`nmgen bench` writers and plots on recorded rows (no GPU): the files exist and hold
exactly the numbers given."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import pytest

from nmgen.bench.results import FIELDS, BenchRow, read_csv, shapes_table, summary, write_all

ROWS = [
    BenchRow("8:32", 32, 256, 2048, 2048, 0.010, 0.030, 0.012, 0.006, 0.009, 2e-7, "exact",
             "cfg_a"),
    BenchRow("8:32", 32, 4096, 8192, 4096, 1.000, 3.200, 0.900, 0.400, 0.950, 3e-7, "nearest",
             "cfg_b", 1.100, "cfg_core"),
    BenchRow("4:32", 32, 256, 2048, 2048, 0.008, 0.030, 0.012, 0.006, 0.007, 1e-6, "model",
             "cfg_c"),
    BenchRow("4:32", 32, 4096, 8192, 4096, 0.500, 3.200, 0.900, 0.400, 0.600, 0.5, "model",
             "cfg_d", 0.450, "cfg_core4"),  # a wrong result must be counted, not hidden
]
CEILINGS = {"fp32_tflops": 60.5, "dram_gbs": 3000.0}


def test_derived_figures():
    r = ROWS[1]
    assert r.speedup == pytest.approx(3.2)
    assert r.ideal == 4 and r.pct_ideal == pytest.approx(80.0)
    assert r.tflops_dense_eq == pytest.approx(2 * 4096 * 8192 * 4096 / 1e-3 / 1e12)
    assert r.tflops_executed == pytest.approx(r.tflops_dense_eq / 4)
    kept = 4096 / 4
    nbytes = 4 * (4096 * 4096 + kept * 8192 + 4096 * 8192) + kept * 8192 / 32
    assert r.intensity == pytest.approx(2 * 4096 * 8192 * 4096 / 4 / nbytes)


def test_summary_geomean_min_max_and_wrong():
    by = {s["pattern"]: s for s in summary(ROWS)}
    assert list(by) == ["8:32", "4:32"]
    assert by["8:32"]["geomean"] == pytest.approx(math.sqrt(3.0 * 3.2))
    assert by["8:32"]["min"] == pytest.approx(3.0) and by["8:32"]["max"] == pytest.approx(3.2)
    assert by["8:32"]["exact"] == 1 and by["8:32"]["wrong"] == 0
    assert by["4:32"]["wrong"] == 1
    assert by["4:32"]["tf32_geomean"] == pytest.approx(math.sqrt(2.5 * 3.2 / 0.9))


def test_summary_against_the_core_kernel():
    """Only shapes where the hand-picked kernel was timed count; a slower tuned kernel is
    counted, by any margin and beyond 3 %."""
    by = {s["pattern"]: s for s in summary(ROWS)}
    assert by["8:32"]["core_shapes"] == 1
    assert by["8:32"]["vs_core_min"] == pytest.approx(1.1)
    assert by["8:32"]["slower_than_core"] == 0
    assert by["4:32"]["vs_core_geomean"] == pytest.approx(0.9)
    assert by["4:32"]["slower_than_core"] == by["4:32"]["slower_than_core_3pct"] == 1
    assert summary(ROWS[:1])[0]["core_shapes"] == 0


def test_the_same_kernel_as_core_is_not_counted_slower():
    """Timed twice, one kernel differs from itself by noise: not a slower tuned kernel."""
    same = BenchRow("8:32", 32, 1024, 4096, 4096, 0.2010, 0.64, 0.1, 0.05, 0.2, 2e-7,
                    "exact", "cfg_core", 0.2000, "cfg_core")
    (s,) = summary([ROWS[1], same])
    assert s["core_shapes"] == 2 and s["core_same_kernel"] == 1
    assert s["slower_than_core"] == 0 and s["vs_core_min_other"] == pytest.approx(1.1)
    assert s["vs_core_min"] == pytest.approx(0.2 / 0.201)  # still shown among all shapes


def test_csv_without_core_columns_still_reads(tmp_path):
    path = tmp_path / "old.csv"
    fields = [f for f in FIELDS if not f.startswith("core")]
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([fields, [getattr(ROWS[0], k) for k in fields]])
    assert read_csv(path) == ROWS[:1]


def test_csv_markdown_json_hold_the_numbers(tmp_path):
    paths = write_all(ROWS, tmp_path, CEILINGS, {"device": "NVIDIA H100 80GB HBM3"})
    assert all(p.exists() for p in paths)
    assert read_csv(tmp_path / "bench.csv") == ROWS  # round trip, every field
    with (tmp_path / "bench.csv").open() as f:
        recs = list(csv.DictReader(f))
    assert float(recs[1]["speedup"]) == pytest.approx(3.2)
    assert float(recs[1]["pct_ideal"]) == pytest.approx(80.0)
    md = (tmp_path / "bench.md").read_text()
    assert "| 8:32 | 2 | 3.10x | 3.00x | 3.20x |" in md
    assert "| 4:32 | 4096 | 8192 | 4096 | 0.5000 | 3.2000 | 6.40x |" in md
    assert "| 0.900, 0.900 | 1 (1) of 1 |" in md and "| not timed | not timed |" not in md
    assert "| model | 5.0e-01 | 0.4500 |" in md and "| exact | 2.0e-07 | – |" in md
    assert "| pattern | M = 256 | M = 4096 |" in md
    assert "| 8:32 | 3.00x | 3.20x |" in md and "| 4:32 | 3.75x | 6.40x |" in md
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["ceilings"] == CEILINGS and record["device"].startswith("NVIDIA H100")
    assert record["summary"][1]["wrong"] == 1
    assert shapes_table(ROWS).count("\n") == len(ROWS) + 2


def test_plots_from_recorded_output(tmp_path):
    pytest.importorskip("matplotlib")
    from nmgen.bench.results import markdown_report

    write_all(ROWS, tmp_path, CEILINGS, {"device": "test GPU"})
    (tmp_path / "bench.md").unlink()  # the tables are written again from the CSV too
    result = subprocess.run([sys.executable, "-m", "nmgen.cli", "plot", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "bench.md").read_text() == markdown_report(ROWS)
    for name in ("speedup.png", "roofline.png", "model.png"):
        png = tmp_path / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert str(png) in result.stdout


def test_by_m_tables(tmp_path):
    from nmgen.bench.results import by_m_table

    speed = by_m_table(ROWS)
    assert "| 8:32 | 3.00x | 3.20x |" in speed and "| 4:32 | 3.75x | 6.40x |" in speed
    rate = by_m_table(ROWS, "tflops_dense_eq", "{:.1f}")
    assert f"| 8:32 | {ROWS[0].tflops_dense_eq:.1f} | {ROWS[1].tflops_dense_eq:.1f} |" in rate
    write_all(ROWS, tmp_path)
    md = (tmp_path / "bench.md").read_text()
    assert "## Geomean dense-equivalent TFLOP/s by M\n\n" + rate in md


def test_bf16_bench_plot_and_table_from_rows(tmp_path):
    """The 16-bit bench's plot (one panel a pattern, semi-structured 2:4 where it ran) and
    summary table, from rows alone (no GPU)."""
    pytest.importorskip("matplotlib")
    from nmgen.bench.decode import DecodeRow, speedup_plot, summary_table

    def row(pattern: str, m: int, ms: float, semi: float | None) -> DecodeRow:
        return DecodeRow(pattern, 128, "rm", "bf16", m, 4096, 4096, ms, 1.0, semi,
                         1 << 20, 3000.0, 1e-3, "model", "cfg")

    rows = [row("2:4", 1024, 0.8, 0.9), row("2:4", 2048, 0.7, 0.95),
            row("8:32", 1024, 0.4, None), row("8:32", 2048, 0.5, None)]
    png = speedup_plot(rows, tmp_path / "speedup.png", "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    table = summary_table(rows)
    assert "| 8:32 | 128 | bf16 | 1024 | 1 | 2.50x |" in table
    assert "| 2:4 | 128 | bf16 | 2048 | 1 | 1.43x |" in table and "1.36x" in table


def test_decode_csv_holds_the_share_of_a_device_copys_bandwidth(tmp_path):
    """``bandwidth_frac``: the weight's bytes over the time against the copy's bandwidth."""
    import csv

    from nmgen.bench.decode import DecodeRow, write_csv

    row = DecodeRow("8:32", 128, "rm", "bf16", 1, 4096, 4096, 0.002, 0.004, None,
                    6_000_000, 4000.0, 1e-3, "model", "cfg", "h200", 5_000_000)
    write_csv([row], tmp_path / "bench.csv")
    (written,) = csv.DictReader((tmp_path / "bench.csv").read_text().splitlines())
    assert float(written["achieved_gbs"]) == 2500.0  # 5 MB the kernel reads in 2 us
    assert float(written["bandwidth_frac"]) == 0.625  # of 4,000 GB/s
