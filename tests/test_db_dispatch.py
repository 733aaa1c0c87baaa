"""The tuned database on a real SQLite file, and the dispatcher's choice on its rows."""

from __future__ import annotations

import dataclasses

import pytest

import nmgen
from nmgen.dispatch import Dispatcher, layout_of
from nmgen.families.f32_simt import F32_SIMT
from nmgen.gpus import gpu_spec
from nmgen.policy import best_per_problem, summary
from nmgen.problem import ALayout, Problem
from nmgen.runtime.device import DeviceInfo
from nmgen.store.database import connect
from nmgen.store.records import DeviceKey, ProblemKey, record_trial
from nmgen.store.tables import TrialStatus

H100 = DeviceInfo("NVIDIA H100 80GB HBM3", 132, 9, 0, 13000)
PROBLEM = Problem(8, 32, 32)
KEY = ProblemKey.of(PROBLEM, (1024, 4096, 4096), DeviceKey("h100", H100.name, 13000, 132),
                    F32_SIMT)
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


def test_the_reference_kernel_wins_within_timing_noise(tmp_path):
    from nmgen.policy import REFERENCE_TIE as CORE_TIE

    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    core = F32_SIMT.reference_config(PROBLEM)
    near = KEY  # the core kernel half the tie band behind the fastest: it wins
    far = KEY.at(PROBLEM, (2048, 4096, 4096))  # twice the band behind: it loses
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
    assert best_per_problem(engine, ProblemKey.of(
        PROBLEM, KEY.shape, dataclasses.replace(KEY.device, gpu="a100"), KEY.template_hash)) == {}
    other_template = ProblemKey.of(PROBLEM, KEY.shape, KEY.device, "u" * 64)
    assert best_per_problem(engine, other_template) == {}


def test_dispatcher_exact_nearest_and_model(db):
    dispatcher = Dispatcher([db], device=H100)
    assert dispatcher.decide(PROBLEM, KEY.shape).source == "exact"
    assert dispatcher.decide(PROBLEM, KEY.shape).config == FAST
    decision = dispatcher.decide(PROBLEM, (1000, 4096, 4096))
    assert (decision.source, decision.config) == ("nearest", FAST)
    other_pattern = Problem(4, 32, 32)  # a record of 8:32: its kernels adapted
    decision = dispatcher.decide(other_pattern, KEY.shape)
    assert decision.source == "transfer" and decision.config.n == 4
    assert dispatcher.decide(other_pattern, KEY.shape) is decision  # cached
    k_major = Problem(8, 32, 32, a_layout=ALayout.K_MAJOR)  # no record of its A layout
    decision = dispatcher.decide(k_major, KEY.shape)
    assert decision.source == "model" and decision.config.a_layout is ALayout.K_MAJOR
    # bf16 at M = 1024 with no bf16 records: the tensor-core family's model choice
    decision = dispatcher.decide(Problem(8, 32, 32, dtype="bf16"), KEY.shape)
    assert decision.source == "model" and decision.config.family == "mma"
    decision = dispatcher.decide(Problem(8, 32, 32, dtype="bf16"), (1, 4096, 4096))
    assert decision.source == "model" and decision.config.family == "gemv"


def test_model_choice_for_unknown_gpu_and_layouts():
    config = F32_SIMT.default_config(Problem(8, 32, 32, a_layout=ALayout.K_MAJOR),
                                     gpu_spec("h100"), KEY.shape)
    assert config.a_layout.value == "km" and (config.n, config.m, config.vec) == (8, 32, 32)
    unknown = Dispatcher([], device=DeviceInfo("Mystery GPU", 100, 9, 0, 13000))
    decision = unknown.decide(Problem(8, 32, 32, a_layout=ALayout.K_MAJOR), KEY.shape)
    assert decision.source == "model" and decision.config.a_layout is ALayout.K_MAJOR


def test_layout_of_arrays():
    import numpy as np

    def of(a):
        return layout_of(a.shape, a.strides, a.itemsize)

    assert of(np.zeros((5, 7), np.float32)).value == "rm"
    assert of(np.zeros((7, 5), np.float32).T).value == "km"
    with pytest.raises(ValueError, match="neither dimension"):
        of(np.zeros((6, 8), np.float32)[::2, ::2])


def test_records_are_keyed_on_the_family_generator():
    """A family's records are keyed on its templates (its own and the shared epilogue) and
    the module of its template arguments: an unroll or any other code-generation change
    orphans the old timings."""
    import hashlib

    files = F32_SIMT.generator_files()
    assert {f.name for f in files} == {"nm_spmm_f32.cu.j2", "epilogue.cuh.j2", "render.py"}
    assert F32_SIMT.generator_hash() == hashlib.sha256(
        b"".join(f.read_bytes() for f in files)).hexdigest()


def test_shipped_records_are_keyed_to_the_current_generator():
    """A change to a family's generator re-keys the records (``nmgen carry``) before it
    lands; otherwise the dispatcher finds none of the shipped tuned kernels."""
    from sqlalchemy import select

    from nmgen.families.registry import all_families
    from nmgen.store.database import shipped_db
    from nmgen.store.tables import ProblemRow

    engine = connect(f"sqlite:///{shipped_db()}", writable=False)
    with engine.connect() as conn:
        hashes = set(conn.execute(select(ProblemRow.template_hash).distinct()).scalars())
    engine.dispose()
    assert hashes <= {f.generator_hash() for f in all_families()}, \
        "run nmgen carry --from-rev <the records' revision>"


@pytest.mark.parametrize("wgmma_ms, first", [(0.3, "wgmma"), (0.9, "mma")])
def test_a_much_faster_family_record_of_a_neighbouring_shape_comes_first(
        tmp_path, wgmma_ms, first):
    """An `mma` exact record (1.0 ms) against a `wgmma` record of a shape one M step away:
    dispatch takes the `wgmma` kernel where, its time scaled to the shape by its model,
    it is more than MUCH_FASTER ahead (0.3 ms at M = 2048 is ~0.6 ms at 4096), else the
    exact record."""
    from nmgen.dispatch import problem_key
    from nmgen.families.registry import get as family_named

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    engine = connect(url)
    problem, shape, neighbour = Problem(2, 4, 128, dtype="bf16"), (4096, 4096, 4096), (
        2048, 4096, 4096)
    for name, at, time_ms in (("mma", shape, 1.0), ("wgmma", neighbour, wgmma_ms)):
        family = family_named(name)
        config = family.default_config(problem, gpu_spec("h100"), at)
        record_trial(engine, problem_key(family, problem, at, H100), config, "h",
                     TrialStatus.OK, time_ms=time_ms)
    ranked = Dispatcher([url], device=H100)._ranking(problem, shape)
    assert [d.config.family for d in ranked][:2] == [first, "mma" if first == "wgmma" else "wgmma"]
    wgmma = next(d for d in ranked if d.config.family == "wgmma")
    assert wgmma.source == "nearest" and 1.5 * wgmma_ms < wgmma.at_shape_ms < 2.5 * wgmma_ms


def test_a_faster_family_record_far_from_the_shape_does_not_come_first(tmp_path):
    """A `wgmma` record at M = 256 is no guide at M = 8, where `gemv` holds the exact
    record, however fast the model scales it (its record lies beyond MUCH_FASTER_WITHIN)."""
    from nmgen.dispatch import problem_key
    from nmgen.families.registry import get as family_named

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    engine = connect(url)
    problem, shape = Problem(8, 32, 128, dtype="bf16"), (8, 4096, 4096)
    for name, at, time_ms in (("gemv", shape, 0.05), ("wgmma", (256, 4096, 4096), 0.005)):
        family = family_named(name)
        config = family.default_config(problem, gpu_spec("h100"), at)
        record_trial(engine, problem_key(family, problem, at, H100), config, "h",
                     TrialStatus.OK, time_ms=time_ms)
    first = Dispatcher([url], device=H100)._ranking(problem, shape)[0]
    assert (first.config.family, first.source) == ("gemv", "exact")


@pytest.mark.parametrize("pattern", ["16:32", "8:32", "4:32", "2:4"])
def test_shipped_bf16_decode_runs_the_faster_family(pattern):
    """The shipped database holds `wgmma` records of the Llama pairs at M = 1-64 and `gemv`
    ones at M = 1, 4, 16, 64 (bf16, L = 128, row-major A;
    results/decode_h100/bf16_l128/tensor_core_m1_64/): where both hold one, dispatch runs
    the family whose record is faster; from M = 8 on, and at the M between, `wgmma`."""
    from nmgen.dispatch import problem_key
    from nmgen.families.registry import get
    from nmgen.store.database import shipped_db

    h100 = DeviceInfo("NVIDIA H100 80GB HBM3", 132, 9, 0, 13020)  # the records' runtime
    url = f"sqlite:///{shipped_db()}"
    dispatcher, engine = Dispatcher([url], device=h100), connect(url, writable=False)
    n, m = map(int, pattern.split(":"))
    problem = Problem(n, m, 128, ALayout.ROW_MAJOR, dtype="bf16")
    for cols, depth in ((4096, 4096), (11008, 4096), (4096, 11008), (2048, 5632)):
        for rows in (1, 4, 16, 64):
            shape = (rows, cols, depth)
            records = {name: best_per_problem(engine, problem_key(
                get(name), problem, shape, h100)) for name in ("gemv", "wgmma")}
            times = {name: r[shape].time_ms for name, r in records.items() if shape in r}
            assert set(times) == {"gemv", "wgmma"}
            pick = dispatcher.decide(problem, shape)
            assert (pick.source, pick.config.family) == ("exact", min(times, key=times.get))
        picks = {rows: dispatcher.decide(problem, (rows, cols, depth)).config.family
                 for rows in (8, 12, 16, 24, 32, 48, 64)}
        assert set(picks.values()) == {"wgmma"}
