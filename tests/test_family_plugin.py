"""A family plugs in without touching the tuner, the store or the dispatcher: the naive
family of ``tests/naive_family`` (defined outside the package) is registered, tuned
(dry run and with a stand-in measurer), stored, shown, exported and dispatched to through
the same paths as the built-in family."""

from __future__ import annotations

import numpy as np
import pytest

import nmgen
from nmgen.dispatch import Dispatcher
from nmgen.families import registry
from nmgen.families.plan import Launch, Pointer
from nmgen.gpus import gpu_spec
from nmgen.policy import best_per_problem, summary
from nmgen.problem import ALayout, Problem
from nmgen.runtime.device import DeviceInfo
from nmgen.store.database import connect
from nmgen.store.tables import TrialStatus
from nmgen.tune.measurers import Measurer
from nmgen.tune.storage import open_storage
from nmgen.tune.task import TuneTask
from nmgen.tune.tuner import Tuner

from .naive_family import NAIVE, NaiveConfig

H100 = DeviceInfo("NVIDIA H100 80GB HBM3", 132, 9, 0, 13000)
PROBLEM = Problem(2, 4, 8)
SHAPE = (96, 80, 72)


@pytest.fixture
def naive():
    registry.register(NAIVE)
    yield NAIVE
    registry.unregister(NAIVE.name)


def _tuner(tmp_path, **kw) -> Tuner:
    return Tuner(connect(f"sqlite:///{tmp_path / 'tuned.db'}"),
                 open_storage(f"journal:{tmp_path / 'studies.journal'}"), trials=6, batch=3,
                 log=lambda s: None, **kw)


class _StandIn(Measurer):
    """Measures as the family's model, recorded as a measurement of this H100 (what a GPU
    measurer does, without the GPU)."""

    def __init__(self, task: TuneTask):
        self.key = task.key(H100.name, H100.cuda_version)
        self._task = task

    def measure(self, config, model_ms):
        return TrialStatus.OK, model_ms, None

    def retime(self, configs, rounds, repeat):
        return {c.name: self._task.family.estimate_ms(c, self._task.gpu, self._task.shape)
                for c in configs}


class _StandInTuner(Tuner):
    def measurer(self, task):
        return _StandIn(task)


def test_registered_family_serves_and_names_its_configs(naive):
    assert naive in registry.serving(PROBLEM)
    assert naive not in registry.serving(Problem(2, 4, 8, dtype="bf16"))
    config = NaiveConfig(2, 4, 8, 128, 2)
    assert registry.config_from_dict(config.to_dict()) == config
    assert registry.family_of(config) is naive
    assert registry.by_generator(naive.generator_hash()) is naive
    code = nmgen.render(config).code
    assert config.name in code and f"nmgen {nmgen.__version__}" in code


def test_unregistered_family_is_unknown():
    assert NAIVE not in registry.serving(PROBLEM)
    with pytest.raises(nmgen.ConfigError, match="unknown kernel family 'naive'"):
        registry.config_from_dict(NaiveConfig(2, 4, 8, 128, 2).to_dict())


def test_family_tunes_in_a_dry_run_and_stores_its_model_trials(naive, tmp_path):
    tuner = _tuner(tmp_path, dry_run=True)
    task = TuneTask(gpu_spec("h100"), naive, PROBLEM, *SHAPE)
    report = tuner.tune(task)
    assert report.trials == 6 and isinstance(report.winner.config, NaiveConfig)
    assert task.study_name.startswith("nmgen_h100_naive_f32_2:4_l8_rm_")
    rows = [r for r in summary(tuner.engine) if r["family"] == "naive"]
    assert len(rows) == 1 and rows[0]["best"] == report.winner.config.name
    assert rows[0]["measured"] is False  # a dry run's estimates are marked as such


def test_family_tunes_stores_and_is_dispatched_to(naive, tmp_path):
    """Tuned through the tuner's usual path, its results stored and read back by the
    policy, and dispatch picks its exact record over the built-in family's model guess."""
    tuner = _StandInTuner(connect(f"sqlite:///{tmp_path / 'tuned.db'}"),
                          open_storage(f"journal:{tmp_path / 'studies.journal'}"), trials=6,
                          batch=3, log=lambda s: None)
    task = TuneTask(gpu_spec("h100"), naive, PROBLEM, *SHAPE)
    report = tuner.tune(task)
    key = task.key(H100.name, H100.cuda_version)
    winners = best_per_problem(tuner.engine, key)
    assert winners[SHAPE].config == report.winner.config
    dispatcher = Dispatcher([f"sqlite:///{tmp_path / 'tuned.db'}"], device=H100)
    decision = dispatcher.decide(PROBLEM, SHAPE)
    assert (decision.source, decision.config) == ("exact", report.winner.config)
    # Another pattern: the naive family's kernel adapted by the default Family.adapt (a
    # tuned family's transfer comes before another family's model guess).
    other = dispatcher.decide(Problem(8, 32, 32), SHAPE)
    assert (other.source, other.config.family) == ("transfer", "naive")
    assert (other.config.n, other.config.m, other.config.vec) == (8, 32, 32)
    assert other.config.threads == report.winner.config.threads


def test_family_plan_is_plain_data(naive):
    config = NaiveConfig(2, 4, 8, 128, 2, a_layout=ALayout.K_MAJOR)
    weight = nmgen.prune(np.random.default_rng(0).standard_normal((72, 80)), "2:4", 8)
    prepared = naive.prepare(weight, config)
    from nmgen.families.plan import Call, Device

    plan = naive.plan(config, prepared, weight.shape, Call(96, 96, True),
                      Device(132, lambda entry, threads, smem: 1))
    (launch,) = plan.launches
    assert isinstance(launch, Launch) and launch.entry == config.name
    assert launch.grid == (-(-96 * 80 // 128), 1, 1) and launch.threads == 128
    assert {a.buffer for a in launch.args if isinstance(a, Pointer)} == {
        "a", "c", "values", "indices"}


@pytest.mark.nvcc
def test_family_compiles_with_nvcc():
    from nmgen.compiler.nvcc import compile_with_nvcc

    registry.register(NAIVE)
    try:
        for layout in ALayout:
            config = NaiveConfig(2, 4, 8, 128, 2, a_layout=layout)
            compiled = compile_with_nvcc(nmgen.render(config))
            assert config.name in compiled.resources, compiled.log
    finally:
        registry.unregister(NAIVE.name)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", list(ALayout))
def test_family_kernel_runs_through_dispatch(naive, tmp_path, layout, gpu_cases):
    """On a GPU: the naive kernel, dispatched from its stored record, matches float64 on
    odd shapes, output poisoned first."""
    from dataclasses import replace

    import cupy as cp

    from nmgen.gpus import spec_or_h100, table_name
    from nmgen.runtime.device import device_info

    info = device_info()
    gpu = replace(spec_or_h100(table_name(info.name)), arch=info.arch)
    tuner = _StandInTuner(connect(f"sqlite:///{tmp_path / 'tuned.db'}"),
                          open_storage(f"journal:{tmp_path / 'studies.journal'}"), trials=3,
                          batch=3, log=lambda s: None)
    problem = Problem(2, 4, 8, layout, info.arch)
    shape = (37, 50, 61)
    task = TuneTask(gpu, naive, problem, *shape)
    tuner.tune(task)
    dispatcher = Dispatcher([f"sqlite:///{tmp_path / 'tuned.db'}"], device=H100.__class__(
        info.name, info.sms, info.major, info.minor, H100.cuda_version))
    weight = nmgen.prune(np.random.default_rng(1).standard_normal((61, 50)), "2:4", 8)
    host = np.random.default_rng(2).standard_normal((37, 61)).astype(np.float32)
    a = cp.asarray(host) if layout is ALayout.ROW_MAJOR else cp.asarray(host.T.copy()).T
    out = cp.full((37, 50), cp.nan, cp.float32)
    dispatcher(a, weight, out)
    assert dispatcher.counts["exact"] == 1
    ref = nmgen.reference(host, weight)
    err = np.linalg.norm(out.get() - ref) / np.linalg.norm(ref)
    assert err < 1e-5
    gpu_cases["kernel_cases"] += 1
