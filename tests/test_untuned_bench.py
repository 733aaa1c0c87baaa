"""``nmgen bench-untuned`` on the host: the problems it reads, the plan it makes from the
databases, its rows, CSV and summary (the timing itself needs a GPU)."""

from __future__ import annotations

import math

import pytest

import nmgen
from nmgen.bench.untuned import (
    FIELDS,
    UntunedRow,
    parse_problems,
    plan,
    read_csv,
    row_of,
    summary_table,
    table_device,
    write_csv,
)
from nmgen.dispatch import Dispatcher
from nmgen.families.f32_simt import F32_SIMT
from nmgen.store.database import connect
from nmgen.store.records import ProblemKey, record_trial
from nmgen.store.tables import TrialStatus

DEVICE = table_device("h100")
SHAPES = [(1024, 4096, 4096), (100, 4096, 11008)]


def test_problems_are_patterns_with_their_vector_length():
    parsed = parse_problems("2:4/32, 8:32/128")
    assert [(p.n, p.m, vec) for p, vec in parsed] == [(2, 4, 32), (8, 32, 128)]
    for bad in ("2:4", "2:4/x", ""):
        with pytest.raises(ValueError):
            parse_problems(bad)


def test_plan_takes_the_first_use_choice_and_the_tuned_winner(tmp_path):
    """Untuned: transferred from the 16:32 record; tuned: the exact record of 2:4; the
    quick candidates start with the untuned kernel."""
    untuned_url, tuned_url = (f"sqlite:///{tmp_path / name}" for name in ("u.db", "t.db"))
    donor = nmgen.KernelConfig(16, 32, 32, 128, 256, 64, 16, 8, a_tile="tx")
    best = nmgen.KernelConfig(2, 4, 32, 128, 128, 32, 8, 8, a_tile="tx")
    for url, config in ((untuned_url, donor), (tuned_url, best)):
        for shape in SHAPES:
            key = ProblemKey("h100", DEVICE.name, "sm_90", 13020, 132,
                             F32_SIMT.generator_hash(), config.n, config.m, 32, "f32", "rm",
                             *shape)
            record_trial(connect(url), key, config, "h", TrialStatus.OK, time_ms=1.0)
    untuned, tuned = (Dispatcher([u], device=DEVICE, write_url="")
                      for u in (untuned_url, tuned_url))
    planned = plan(parse_problems("2:4/32"), SHAPES, untuned, tuned, DEVICE.arch, quick=True)
    assert [p.untuned.source for p in planned] == ["transfer", "transfer"]
    assert all(p.tuned.config == best for p in planned)
    assert all(p.quick[0] == p.untuned.config and len(p.quick) == 4 for p in planned)
    with pytest.raises(ValueError, match="untuned databases hold records of 2"):
        plan(parse_problems("2:4/32"), SHAPES, tuned, tuned, DEVICE.arch)
    with pytest.raises(ValueError, match="lacks 2 problems"):
        plan(parse_problems("16:32/32"), SHAPES, tuned, tuned, DEVICE.arch)

    times = {"untuned": 1.2, "tuned": 1.0, "dense": 2.0,
             planned[0].quick[1].name: 1.1, planned[0].quick[2].name: 1.05}
    row = row_of(planned[0], times)
    assert (row.pattern, row.vec, row.M, row.N, row.K) == ("2:4", 32, 1024, 4096, 4096)
    assert row.quick_ms == 1.05 and row.ratio == pytest.approx(1.2)
    assert row.untuned_source == "transfer" and row.tuned_config == best.name


def test_csv_round_trip_and_summary(tmp_path):
    rows = [UntunedRow("2:4", 32, 1024, 4096, 4096, 1.2, 1.0, 2.0, 1.1, "transfer", "x",
                       "a", "b"),
            UntunedRow("2:4", 32, 100, 4096, 11008, 0.5, 0.4, 0.6, None, "model", "model",
                       "c", "d")]
    path = tmp_path / "untuned.csv"
    write_csv(rows, path)
    header = path.read_text().splitlines()[0].split(",")
    assert header[:8] == ["pattern", "vec", "M", "N", "K", "untuned_ms", "tuned_ms",
                          "dense_ms"] and header == FIELDS
    assert read_csv(path) == rows
    table = summary_table(rows)
    assert f"{math.sqrt(1.2 * 1.25):.3f}" in table and "1.250" in table  # geomean, worst
    assert "1.100" in table  # quick / tuned of the one row that has it
