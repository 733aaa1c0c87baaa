"""The tuner's bookkeeping on the CPU: the dry run's model measurer stands in for the GPU,
here made to report the failures a GPU run can meet."""

from __future__ import annotations

import optuna

from nmgen.config import ALayout
from nmgen.db import TrialStatus, connect, trials_of
from nmgen.model import gpu_spec
from nmgen.tuner import INFEASIBLE_MS, ModelMeasurer, Tuner, TuneTask


class FailingMeasurer(ModelMeasurer):
    """Every configuration fails to compile, as a broken template would make it."""

    def measure(self, config, model_ms):
        return TrialStatus.COMPILE_ERROR, INFEASIBLE_MS, "nvrtc: error (test)"


class FailingTuner(Tuner):
    def measurer(self, task):
        return FailingMeasurer(task)


def test_failed_measurements_complete_as_constraint_violations(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    task = TuneTask(gpu_spec("h100"), 2, 4, 16, ALayout.ROW_MAJOR, 64, 256, 512)
    tuner = FailingTuner(connect(url), url, trials=4, batch=4, dry_run=True)
    tuner.tune(task, time_budget_s=2.0)
    study = optuna.load_study(study_name=tuner.study_name(task), storage=url)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 4
    assert all(t.value == INFEASIBLE_MS and t.user_attrs["violation"] > 0 for t in complete)
    rows = trials_of(tuner.engine, FailingMeasurer(task).key)
    assert rows and all(r.status == TrialStatus.COMPILE_ERROR and r.time_ms is None
                        for r in rows)
