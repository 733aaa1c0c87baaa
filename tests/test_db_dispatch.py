"""The tuned database on a real SQLite file, and the dispatcher's choice on its rows."""

from __future__ import annotations

import pytest

import nmgen
from nmgen.db import ProblemKey, TrialStatus, best_per_problem, connect, record_trial, summary
from nmgen.dispatch import Dispatcher, layout_of, model_choice

KEY = ProblemKey(gpu="h100", device_name="NVIDIA H100 80GB HBM3", arch="sm_90",
                 cuda_version=13000, sms=132, template_hash="t" * 64, n=8, m=32, vec=32,
                 dtype="f32", a_layout="rm", rows=1024, cols=4096, depth=4096)
FAST = nmgen.KernelConfig(8, 32, 32, 128, 256, 64, 8, 8, a_tile="tm")
SLOW = nmgen.KernelConfig(8, 32, 32, 64, 128, 32, 8, 4, warp_m=4, warp_n=8)


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    engine = connect(url)
    record_trial(engine, KEY, SLOW, "h", TrialStatus.OK, time_ms=2.0, model_ms=1.5)
    record_trial(engine, KEY, FAST, "h", TrialStatus.OK, time_ms=1.0, model_ms=1.1)
    record_trial(engine, KEY, SLOW.replace(stages=3), "h", TrialStatus.WRONG, error="err")
    return url


def test_round_trip_and_deterministic_winner(db):
    engine = connect(db)
    winners = best_per_problem(engine, KEY)
    assert winners[(1024, 4096, 4096)].config == FAST
    # A tie at the same time is broken by name, whatever the insertion order.
    tie = FAST.replace(stages=3)
    record_trial(engine, KEY, tie, "h", TrialStatus.OK, time_ms=1.0)
    assert best_per_problem(engine, KEY)[(1024, 4096, 4096)].config == min(
        [FAST, tie], key=lambda c: c.name)
    rows = summary(engine)
    assert rows[0]["trials"] == 4 and rows[0]["ok"] == 3
    assert rows[0]["tflops"] == pytest.approx(2 * 1024 * 4096 * 4096 / 1.0 / 1e9)


def test_sqlite_databases_log_ahead_and_sync_at_checkpoints(db):
    """Every connection to a SQLite file is in WAL mode with synchronous=NORMAL (1): the
    tuner commits a row a kernel, several workers at once."""
    from sqlalchemy import text

    engine = connect(db)
    for _ in range(2):  # each new connection, not only the first
        with engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA synchronous")).scalar() == 1
        engine.dispose()


def test_the_core_kernel_wins_within_timing_noise(tmp_path):
    from nmgen.config import ALayout, Arch
    from nmgen.db import CORE_TIE
    from nmgen.space import Problem, core_config

    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    core = core_config(Problem(8, 32, 32, ALayout.ROW_MAJOR, Arch.SM90))
    near = KEY  # the core kernel half the tie band behind the fastest: it wins
    far = KEY.__class__(**{**KEY.__dict__, "rows": 2048})  # twice the band behind: it loses
    for key, behind in ((near, CORE_TIE / 2), (far, 2 * CORE_TIE)):
        record_trial(engine, key, FAST, "h", TrialStatus.OK, time_ms=1.0)
        record_trial(engine, key, core, "h", TrialStatus.OK, time_ms=1.0 + behind)
    winners = best_per_problem(engine, KEY)
    assert winners[(1024, 4096, 4096)].config == core
    assert winners[(1024, 4096, 4096)].time_ms == pytest.approx(1.0 + CORE_TIE / 2)
    assert winners[(2048, 4096, 4096)].config == FAST
    shown = {row["shape"]: row["best"] for row in summary(engine)}  # `nmgen show` agrees
    assert shown == {(1024, 4096, 4096): core.name, (2048, 4096, 4096): FAST.name}


def test_records_of_another_gpu_or_template_do_not_match(db):
    engine = connect(db)
    assert best_per_problem(engine, KEY.__class__(**{**KEY.__dict__, "gpu": "a100"})) == {}
    other_template = KEY.__class__(**{**KEY.__dict__, "template_hash": "u" * 64})
    assert best_per_problem(engine, other_template) == {}


def test_dispatcher_exact_nearest_and_model(db):
    dispatcher = Dispatcher([db])
    assert dispatcher.decide(KEY).source == "exact"
    assert dispatcher.decide(KEY).config == FAST
    nearby = KEY.__class__(**{**KEY.__dict__, "rows": 1000})
    decision = dispatcher.decide(nearby)
    assert (decision.source, decision.config) == ("nearest", FAST)
    other_pattern = KEY.__class__(**{**KEY.__dict__, "n": 4})
    decision = dispatcher.decide(other_pattern)
    assert decision.source == "model" and decision.config.n == 4
    assert dispatcher.decide(other_pattern) is decision  # cached


def test_model_choice_for_unknown_gpu_and_layouts():
    key = KEY.__class__(**{**KEY.__dict__, "gpu": "mystery_gpu", "a_layout": "km"})
    config = model_choice(key)
    assert config.a_layout.value == "km" and (config.n, config.m, config.vec) == (8, 32, 32)


def test_layout_of_arrays():
    import numpy as np

    def of(a):
        return layout_of(a.shape, a.strides)

    assert of(np.zeros((5, 7), np.float32)).value == "rm"
    assert of(np.zeros((7, 5), np.float32).T).value == "km"
    with pytest.raises(ValueError, match="neither dimension"):
        of(np.zeros((6, 8), np.float32)[::2, ::2])


def test_records_are_keyed_on_the_template_and_the_generator():
    import hashlib
    from pathlib import Path

    from nmgen import codegen
    from nmgen.config import Family
    from nmgen.dispatch import template_hash

    text = codegen.template_text(Family.F32_SIMT) + Path(codegen.__file__).read_text()
    assert template_hash() == hashlib.sha256(text.encode()).hexdigest()
    # an unroll or any other code-generation change orphans the old timings
    assert template_hash() != hashlib.sha256(
        codegen.template_text(Family.F32_SIMT).encode()).hexdigest()


def test_shipped_records_are_keyed_to_the_current_generator():
    """A change to the template or the code generator re-keys the records (``nmgen carry``)
    before it lands; otherwise the dispatcher finds none of the shipped tuned kernels."""
    from sqlalchemy import select

    from nmgen.db import ProblemRow, shipped_db
    from nmgen.dispatch import template_hash

    engine = connect(f"sqlite:///{shipped_db()}")
    with engine.connect() as conn:
        hashes = set(conn.execute(select(ProblemRow.template_hash).distinct()).scalars())
    engine.dispose()
    assert hashes == {template_hash()}, "run nmgen carry --from-rev <the records' revision>"
