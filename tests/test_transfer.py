"""Kernels for problems nobody tuned: a family's kernels adapted to another pattern or
vector length (``Family.adapt``), the tuned problems they come from (``policy``), their
ranking (``nmgen.transfer``), dispatch's order exact → nearest → transfer → model, and a
quick tune's candidates, results and records (its GPU timing faked on the CPU; the real
one is the ``gpu`` test at the end)."""

from __future__ import annotations

import math

import pytest

import nmgen
from nmgen.calibration import Calibration
from nmgen.dispatch import Dispatcher, quick_decision, tune_mode
from nmgen.families.f32_simt import F32_SIMT
from nmgen.families.f32_simt.space import core_config
from nmgen.families.gemv import GEMV
from nmgen.families.gemv.config import GemvConfig
from nmgen.gpus import gpu_spec
from nmgen.policy import REFERENCE_TIE, related_records
from nmgen.problem import ALayout, Problem
from nmgen.runtime import check
from nmgen.runtime.device import DeviceInfo
from nmgen.store.database import connect
from nmgen.store.records import DeviceKey, ProblemKey, record_trial, trials_of
from nmgen.store.tables import TrialStatus
from nmgen.transfer import MODEL, problem_distance, ranked, transferred

H100 = DeviceInfo("NVIDIA H100 80GB HBM3", 132, 9, 0, 13000)
GPU = gpu_spec("h100")
SHAPE = (1024, 4096, 4096)
# 16:32 winners: a 128x256 tile of KS = 64 (2 windows) and a 64x128 one of KS = 128
WIDE = nmgen.KernelConfig(16, 32, 32, 128, 256, 64, 16, 8, a_tile="tx", tma=True)
NARROW = nmgen.KernelConfig(16, 32, 32, 64, 128, 128, 8, 8, a_tile="tx")


def key_of(family, n, m, vec, shape, dtype="f32", layout="rm") -> ProblemKey:
    return ProblemKey.of(Problem(n, m, vec, layout, dtype=dtype), shape,
                         DeviceKey("h100", H100.name, H100.cuda_version, H100.sms), family)


def record(engine, config, time_ms, shape=SHAPE, family=F32_SIMT, dtype="f32"):
    key = key_of(family, config.n, config.m, config.vec, shape, dtype,
                 config.a_layout.value)
    record_trial(engine, key, config, "h", TrialStatus.OK, time_ms=time_ms)


@pytest.fixture
def tuned(tmp_path):
    """A database with 16:32 and 4:32 records (L = 32, row-major A) at two shapes."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    engine = connect(url)
    record(engine, WIDE, 1.0)
    record(engine, NARROW, 1.2)
    record(engine, NARROW, 0.3, shape=(256, 4096, 4096))
    four = nmgen.KernelConfig(4, 32, 32, 64, 256, 128, 16, 4, warp_m=4, warp_n=8,
                              a_tile="tx", tma=True)
    record(engine, four, 0.4)
    return url


# ------------------------------------------------------------------ Family.adapt
def test_fp32_kernels_adapt_to_other_patterns_and_vector_lengths():
    """The same tiles and pipeline; the stage depth KS nearest the tuned one that the
    space offers the new window (at most 8 windows: KS = 32 for m = 4)."""
    for n, m, vec, ks in ((2, 4, 32, 32), (2, 8, 32, 64), (8, 32, 128, 64), (8, 32, 16, 64)):
        problem = Problem(n, m, vec)
        adapted = F32_SIMT.adapt(WIDE, problem)
        assert (adapted.n, adapted.m, adapted.vec, adapted.ks) == (n, m, vec, ks)
        assert (adapted.ms, adapted.ns, adapted.mt, adapted.nt, adapted.tma) == (
            WIDE.ms, WIDE.ns, WIDE.mt, WIDE.nt, WIDE.tma)
        assert F32_SIMT.in_space(adapted, problem)
    assert F32_SIMT.adapt(NARROW, Problem(2, 4, 32)).ks == 32


def test_default_adapt_keeps_the_configuration_or_returns_none():
    """The base class's adapt (the decode family has no adapt of its own): the same
    parameters where valid; ``None`` where no kernel of the space serves the problem."""
    config = GemvConfig(8, 32, 128, rows=4, col_threads=64, lanes=4, cols=8, unroll=4,
                        split_k=16, dtype="bf16")
    adapted = GEMV.adapt(config, Problem(2, 4, 128, dtype="bf16"))
    assert adapted == config.replace(n=2, m=4)
    assert GEMV.adapt(config, Problem(2, 4, 128, dtype="f32")) is None  # 8 f32: 32 bytes
    assert not GEMV.in_space(config, Problem(2, 4, 128, dtype="bf16"))


# ------------------------------------------------------------------ the tuned problems
def test_related_records_list_every_pattern_winner_first(tuned):
    records = related_records(connect(tuned), key_of(F32_SIMT, 2, 4, 32, (1, 1, 1)), top=2)
    found = {(r.n, r.m, r.vec, r.shape): r for r in records}
    assert set(found) == {(16, 32, 32, SHAPE), (16, 32, 32, (256, 4096, 4096)),
                          (4, 32, 32, SHAPE)}
    assert found[(16, 32, 32, SHAPE)].configs == (WIDE, NARROW)
    assert found[(16, 32, 32, SHAPE)].time_ms == 1.0
    k_major = key_of(F32_SIMT, 2, 4, 32, (1, 1, 1), layout="km")
    assert related_records(connect(tuned), k_major) == []
    others = related_records(connect(tuned), key_of(F32_SIMT, 16, 32, 32, (1, 1, 1)),
                             other_patterns=True)  # the 16:32 problems' own left out
    assert [(r.n, r.m, r.vec, r.shape) for r in others] == [(4, 32, 32, SHAPE)]


def test_related_records_follow_the_winner_rule(tmp_path):
    """The reference kernel within the tie of the fastest is a problem's winner."""
    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    core = core_config(Problem(16, 32, 32))
    record(engine, WIDE, 1.0)
    record(engine, core, 1.0 + REFERENCE_TIE / 2)
    (found,) = related_records(engine, key_of(F32_SIMT, 2, 4, 32, (1, 1, 1)))
    assert found.configs[0] == core and found.configs[1] == WIDE


def test_nearer_problems_first_density_before_vector_length(tuned):
    records = {(r.n, r.m, r.shape): r
               for r in related_records(connect(tuned), key_of(F32_SIMT, 2, 4, 32, SHAPE))}
    problem = Problem(2, 4, 32)  # density 1/2, as 16:32
    same_density = problem_distance(records[(16, 32, SHAPE)], problem, SHAPE)
    other_density = problem_distance(records[(4, 32, SHAPE)], problem, SHAPE)
    other_shape = problem_distance(records[(16, 32, (256, 4096, 4096))], problem, SHAPE)
    assert same_density < other_shape < other_density
    found = transferred(F32_SIMT, problem, SHAPE, GPU, list(records.values()))
    assert [origin for _, origin, _ in found][0] == "16:32 L=32 1024x4096x4096"
    assert all(c.n == 2 and c.m == 4 for c, _, _ in found)
    assert len({c.name for c, _, _ in found}) == len(found)
    # a problem's own records are no transfer
    own = transferred(F32_SIMT, Problem(16, 32, 32), SHAPE, GPU, list(records.values()))
    assert {origin for _, origin, _ in own} == {"4:32 L=32 1024x4096x4096"}


def test_candidates_ranked_by_the_calibrated_model(tuned):
    records = related_records(connect(tuned), key_of(F32_SIMT, 2, 4, 32, SHAPE))
    problem = Problem(2, 4, 32)
    plain = ranked(F32_SIMT, problem, SHAPE, GPU, Calibration("f32"), records)
    estimates = [c.estimate_ms for c in plain]
    assert estimates == sorted(estimates)
    assert estimates[0] == pytest.approx(F32_SIMT.estimate_ms(plain[0].config, GPU, SHAPE))
    assert {c.origin for c in plain} >= {MODEL, "16:32 L=32 1024x4096x4096"}
    assert all(math.isinf(c.distance) == (c.origin == MODEL) for c in plain)
    # A calibration that finds the kernels without the bulk copy engine 4x faster
    favour = Calibration("f32", terms=(("tma", "False"),),
                         weights=(0.0, 0.0, -math.log(4), 0.0), center=math.log(1024))
    first = ranked(F32_SIMT, problem, SHAPE, GPU, favour, records)[0]
    assert not first.config.tma
    assert first.estimate_ms == pytest.approx(
        F32_SIMT.estimate_ms(first.config, GPU, SHAPE) / 4)


# ------------------------------------------------------------------ dispatch
def test_dispatch_transfers_before_the_model(tuned):
    dispatcher = Dispatcher([tuned], device=H100)
    decision = dispatcher.decide(Problem(2, 4, 32), SHAPE)
    assert decision.source == "transfer" and (decision.config.n, decision.config.m) == (2, 4)
    assert decision.origin and math.isfinite(decision.distance)
    assert decision.time_ms == pytest.approx(dispatcher.calibration(
        F32_SIMT, key_of(F32_SIMT, 2, 4, 32, SHAPE), GPU).estimate_ms(
        F32_SIMT, decision.config, GPU, SHAPE))
    assert dispatcher.decide(Problem(16, 32, 32), SHAPE).source == "exact"
    assert dispatcher.decide(Problem(16, 32, 32), (512, 4096, 4096)).source == "nearest"
    k_major = dispatcher.decide(Problem(2, 4, 32, ALayout.K_MAJOR), SHAPE)
    assert k_major.source == "model"


def test_dispatch_transfers_within_a_familys_regime(tmp_path):
    """Decode records (M = 1) of 8:32 serve another pattern at M = 1 through the decode
    family, not at M = 2048, where the tiled family's model guess (in its regime) comes
    before the decode family's."""
    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    decode = GemvConfig(8, 32, 32, rows=1, col_threads=128, lanes=2, cols=4, unroll=4,
                        split_k=8)
    record(engine, decode, 0.02, shape=(1, 4096, 4096), family=GEMV)
    dispatcher = Dispatcher([f"sqlite:///{tmp_path / 'tuned.db'}"], device=H100)
    small = dispatcher.decide(Problem(2, 8, 32), (1, 4096, 4096))
    assert (small.source, small.config.family) == ("transfer", "gemv")
    assert (small.config.n, small.config.m) == (2, 8)
    assert small.origin in ("8:32 L=32 1x4096x4096", "model")
    large = dispatcher.decide(Problem(2, 8, 32), (2048, 4096, 4096))
    assert (large.source, large.config.family) == ("model", "f32")


def test_tune_mode_from_the_argument_or_the_environment(monkeypatch):
    assert tune_mode(None) is None and tune_mode("off") is None and tune_mode("") is None
    assert tune_mode("quick") == "quick" and tune_mode(" Quick ") == "quick"
    with pytest.raises(ValueError, match="tune='slow'"):
        tune_mode("slow")
    monkeypatch.setenv("NMGEN_TUNE", "quick")
    assert Dispatcher([], device=H100).tune == "quick"
    monkeypatch.delenv("NMGEN_TUNE")
    assert Dispatcher([], device=H100).tune is None


# ------------------------------------------------------------------ quick tune
def test_quick_candidates_start_with_the_decision(tuned):
    dispatcher = Dispatcher([tuned], device=H100)
    problem = Problem(2, 4, 32)
    candidates = dispatcher.quick_candidates(problem, SHAPE)
    assert candidates[0] == dispatcher.decide(problem, SHAPE).config
    assert len(candidates) == 4 == len(set(candidates))
    assert all((c.n, c.m, c.vec) == (2, 4, 32) for c in candidates)
    assert len(dispatcher.quick_candidates(problem, SHAPE, count=2)) == 2


def test_quick_decision_follows_the_winner_rule():
    problem = Problem(16, 32, 32)
    core = core_config(problem)
    assert quick_decision(problem, [(WIDE, None), (NARROW, None)]) is None
    fastest = quick_decision(problem, [(WIDE, 1.0), (NARROW, 0.9), (core, None)])
    assert (fastest.source, fastest.config, fastest.time_ms) == ("quick", NARROW, 0.9)
    tie = quick_decision(problem, [(NARROW, 1.0), (core, 1.0 + REFERENCE_TIE / 2)])
    assert tie.config == core  # as the next process's exact lookup will pick


def test_quick_tune_stores_its_timings_and_the_next_process_finds_them(tuned, tmp_path,
                                                                         monkeypatch):
    """The GPU part faked: the candidates are 'timed' (one fails its check), stored in
    the user's database as trials, the fastest used; a second call times nothing again,
    and a new dispatcher (the next process) finds an exact record."""
    mine = f"sqlite:///{tmp_path / 'mine.db'}"
    timed_calls = []

    def fake_time(problem, shape, configs):
        timed_calls.append([c.name for c in configs])
        return [check.Timed(c, None, "relative error 1", True) if i == 1 else
                check.Timed(c, 0.5 + 0.1 * i) for i, c in enumerate(configs)]

    monkeypatch.setattr(check, "time_candidates", fake_time)
    dispatcher = Dispatcher([mine, tuned], device=H100, tune="quick")
    problem = Problem(2, 4, 32)
    candidates = dispatcher.quick_candidates(problem, SHAPE)
    decision = dispatcher.quick_tune(problem, SHAPE)
    assert (decision.source, decision.config, decision.time_ms) == ("quick", candidates[0],
                                                                    0.5)
    assert dispatcher.quick_tune(problem, SHAPE) is decision and len(timed_calls) == 1
    rows = trials_of(connect(mine), key_of(F32_SIMT, 2, 4, 32, SHAPE))
    assert sorted(r.status for r in rows) == sorted(
        [TrialStatus.OK] * (len(candidates) - 1) + [TrialStatus.WRONG])
    assert all(r.model_ms and r.model_ms > 0 for r in rows)
    later = Dispatcher([mine, tuned], device=H100)
    assert later.decide(problem, SHAPE).source == "exact"
    assert later.decide(problem, SHAPE).config == candidates[0]


def test_quick_tune_without_a_database_to_write(tuned, monkeypatch):
    monkeypatch.setattr(check, "time_candidates", lambda problem, shape, configs: [
        check.Timed(c, None, "launch failed") for c in configs])
    dispatcher = Dispatcher([tuned], device=H100, write_url="")
    problem = Problem(2, 4, 32)
    untuned = dispatcher.decide(problem, SHAPE)
    assert dispatcher.quick_tune(problem, SHAPE) is untuned  # none ran: the decision stays
    assert dispatcher.store_timings(problem, SHAPE, []) is None


@pytest.mark.gpu
def test_dispatch_quick_tunes_on_first_use(tuned, tmp_path):
    """On a GPU: ``dispatch(..., tune="quick")`` on a problem with no record of its own
    times its candidates once, stores them and runs the fastest, correctly."""
    import cupy as cp
    import numpy as np

    mine = f"sqlite:///{tmp_path / 'mine.db'}"
    dispatcher = Dispatcher([mine, tuned], tune="quick")
    weight = nmgen.prune(np.random.default_rng(0).standard_normal((512, 384)), "2:4", 32)
    host = np.random.default_rng(1).standard_normal((100, 512)).astype(np.float32)
    out = cp.full((100, 384), cp.nan, cp.float32)
    dispatcher(cp.asarray(host), weight, out)
    dispatcher(cp.asarray(host), weight, out)
    assert dispatcher.counts["quick"] == 2
    ref = nmgen.reference(host, weight)
    assert np.linalg.norm(out.get() - ref) / np.linalg.norm(ref) < 1e-5
    problem = Problem(2, 4, 32, arch=dispatcher.device.arch)
    assert Dispatcher([mine]).decide(problem, (100, 384, 512)).source == "exact"
