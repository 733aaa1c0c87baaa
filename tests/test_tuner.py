"""The tuner's bookkeeping on the CPU: the dry run's model measurer stands in for the GPU,
here made to report the failures a GPU run can meet."""

from __future__ import annotations

import optuna

from nmgen.codegen import render
from nmgen.families.f32_simt import F32_SIMT
from nmgen.families.f32_simt.config import KernelConfig
from nmgen.families.f32_simt.space import core_config
from nmgen.gpus import gpu_spec
from nmgen.policy import best_per_problem
from nmgen.problem import ALayout
from nmgen.store.database import connect
from nmgen.store.records import record_trial, trials_of, update_times
from nmgen.store.tables import TrialStatus
from nmgen.tune.measurers import INFEASIBLE_MS, ModelMeasurer
from nmgen.tune.seeds import SEEDS_FROM_MODEL, model_seeds
from nmgen.tune.storage import open_storage
from nmgen.tune.task import TuneTask
from nmgen.tune.tuner import FINALISTS, Tuner, suggest_config


def task_of(gpu: str, n: int, m: int, vec: int, layout: ALayout, *shape: int) -> TuneTask:
    return TuneTask.of(gpu_spec(gpu), F32_SIMT, n, m, vec, layout, shape)


class FailingMeasurer(ModelMeasurer):
    """Every configuration fails to compile, as a broken template would make it."""

    def measure(self, config, model_ms):
        return TrialStatus.COMPILE_ERROR, INFEASIBLE_MS, "nvrtc: error (test)"


class FailingTuner(Tuner):
    def measurer(self, task):
        return FailingMeasurer(task)


def test_failed_measurements_complete_as_constraint_violations(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    task = task_of("h100", 2, 4, 16, ALayout.ROW_MAJOR, 64, 256, 512)
    tuner = FailingTuner(connect(url), url, trials=4, batch=4, dry_run=True)
    tuner.tune(task, time_budget_s=2.0)
    study = optuna.load_study(study_name=tuner.study_name(task), storage=url)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 4
    assert all(t.value == INFEASIBLE_MS and t.user_attrs["violation"] > 0 for t in complete)
    rows = trials_of(tuner.engine, FailingMeasurer(task).key)
    assert rows and all(r.status == TrialStatus.COMPILE_ERROR and r.time_ms is None
                        for r in rows)


def test_seeds_core_kernel_then_nearest_winners_then_model(tmp_path):
    """A study first tries the core benchmark's hand-picked kernel, then the winners of
    the nearest tuned shapes (nearest first), then the model's best guesses."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    tuner = Tuner(connect(url), url, trials=8, batch=8, dry_run=True)
    shapes = [(256, 2048, 2048), (4096, 8192, 8192), (512, 2048, 2048)]
    tasks = [task_of("h100", 8, 32, 32, ALayout.ROW_MAJOR, *s) for s in shapes]
    for task in tasks[:2]:
        tuner.tune(task)
    key = ModelMeasurer(tasks[2]).key
    winners = best_per_problem(tuner.engine, key, TrialStatus.MODEL)
    seeds = tuner.seeds(tasks[2], key)
    core = core_config(tasks[2].problem)
    assert seeds[0] == core
    # (256, 2048, 2048) is nearer than (4096, 8192, 8192) to (512, 2048, 2048).
    expected = [w.config for w in (winners[shapes[0]], winners[shapes[1]]) if w.config != core]
    assert [c for c in seeds[1:] if c in expected] == list(dict.fromkeys(expected))
    assert set(model_seeds(tasks[2], SEEDS_FROM_MODEL)) <= set(seeds)
    tuner.tune(tasks[2])
    study = optuna.load_study(study_name=tuner.study_name(tasks[2]), storage=url)
    first = min(study.trials, key=lambda t: t.number)
    assert first.user_attrs["config"] == core.name


def test_report_says_where_the_time_went(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    task = task_of("h100", 2, 4, 16, ALayout.ROW_MAJOR, 64, 256, 512)
    report = Tuner(connect(url), url, trials=8, batch=4, dry_run=True).tune(task)
    phases = report.phases.seconds
    assert set(phases) == {"setup", "optuna", "compile", "measure", "confirm"}
    assert all(s >= 0 for s in phases.values())
    assert sum(phases.values()) <= report.seconds


def test_finalists_timed_again_before_one_wins(tmp_path):
    """A lucky first timing (here: a slow configuration stored as the fastest) does not
    survive the next call's confirmation of the finalists; the core kernel is one of them."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    task = task_of("h100", 8, 32, 32, ALayout.ROW_MAJOR, 256, 2048, 2048)
    tuner = Tuner(connect(url), url, trials=8, batch=8, dry_run=True)
    key = ModelMeasurer(task).key
    shape = (256, 2048, 2048)
    honest = tuner.tune(task).winner
    core = core_config(task.problem).name
    ranked = sorted((r.time_ms, r.config_row.name) for r in trials_of(tuner.engine, key)
                    if r.status == TrialStatus.MODEL and r.config_row.name != core)
    slow_ms, slow = ranked[-1]
    update_times(tuner.engine, key, {slow: honest.time_ms / 2})  # the lucky timing
    assert best_per_problem(tuner.engine, key, TrialStatus.MODEL)[shape].config.name == slow

    # Enough trials that some are feasible and measured (the model's), so that it confirms.
    times = Tuner(connect(url), url, trials=40, batch=8, dry_run=True).tune(task)
    assert times.measured > 0
    assert slow_ms > honest.time_ms
    again = best_per_problem(tuner.engine, key, TrialStatus.MODEL)[shape]
    assert again.config.name != slow and again.time_ms <= honest.time_ms
    stored = {r.config_row.name: r.time_ms for r in trials_of(tuner.engine, key)}
    assert stored[slow] == slow_ms  # put back to its model time
    confirmed = tuner.confirm(task, ModelMeasurer(task))
    assert core in confirmed
    assert len(confirmed) <= FINALISTS + 1 and slow not in confirmed
    assert times.winner.config.name == again.config.name


def test_ahead_processes_share_the_host(monkeypatch):
    from nmgen.tune import tuner

    for cpus, local, ahead in ((16, 1, 7), (32, 1, 8), (32, 2, 7), (64, 2, 8), (2, 1, 0),
                               (32, 8, 0)):
        monkeypatch.setattr(tuner.os, "sched_getaffinity", lambda pid, n=cpus: range(n),
                            raising=False)
        monkeypatch.setenv("NMGEN_LOCAL_WORKERS", str(local))
        assert tuner.default_ahead_workers(8) == ahead, (cpus, local)


class RecordingPool:
    """Stands in for the compile processes: keeps what was queued ahead, in order."""

    def __init__(self):
        self.queued: list[list[str]] = []

    def ahead(self, configs):
        self.queued.append([c.name for c in configs])
        return len(configs)


def test_core_kernels_queued_ahead_before_any_ranking(tmp_path, monkeypatch):
    """compile_ahead queues the core kernel of each study before it ranks the space for
    the other seeds (the first ranking takes seconds; the core kernel is the slowest
    seed to compile), and each study's seeds only once."""
    from nmgen.tune import seeds as seeds_module
    from nmgen.tune import tuner as tuner_module

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    pool = RecordingPool()
    tuner = Tuner(connect(url), url, ahead_workers=2, _compile_pool=pool)
    tasks = [task_of("h100", n, 32, 32, ALayout.ROW_MAJOR, 256, 2048, 2048)
             for n in (8, 4)]
    monkeypatch.setattr(tuner_module.GpuMeasurer, "key_of",  # no device here
                        staticmethod(lambda task: ModelMeasurer(task).key))
    ranked_after: list[int] = []  # how many batches were queued when each ranking began
    real_model_seeds = seeds_module.model_seeds

    def noted_model_seeds(task, count):
        ranked_after.append(len(pool.queued))
        return real_model_seeds(task, count)

    monkeypatch.setattr(seeds_module, "model_seeds", noted_model_seeds)
    tuner.compile_ahead(tasks)
    cores = [core_config(t.problem).name for t in tasks]
    assert pool.queued[0] == cores and min(ranked_after) == 1
    assert [q[0] for q in pool.queued[1:]] == cores  # then each study's seeds, core first
    assert tuner.compile_ahead(tasks) == 0 and len(pool.queued) == 4  # nothing twice


def test_a_study_starts_from_the_seeds_stored_in_it(tmp_path):
    """The worker that creates a study stores in it the seeds it ranked, those that
    ``Tuner.seeds`` gives at that moment; the study's first trials are those, in order."""
    from nmgen.tune.studies import stored_seeds

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    tuner = Tuner(connect(url), url, trials=16, batch=8, dry_run=True, log=lambda s: None)
    shapes = [(256, 2048, 2048), (4096, 8192, 8192), (512, 2048, 2048)]
    tasks = [task_of("h100", 8, 32, 32, ALayout.ROW_MAJOR, *s) for s in shapes]
    for task in tasks[:2]:
        tuner.tune(task)
    expected = tuner.seeds(tasks[2], ModelMeasurer(tasks[2]).key)
    tuner.tune(tasks[2])
    study = optuna.load_study(study_name=tuner.study_name(tasks[2]), storage=url)
    names = [c.name for c in expected]
    assert stored_seeds(study) == names and tuner.stored_seeds(tasks[2]) == expected
    first = sorted(study.trials, key=lambda t: t.number)[:len(names)]
    assert [t.user_attrs["config"] for t in first] == names


CREATE_STUDY = """
import sys
from nmgen.families.f32_simt import F32_SIMT
from nmgen.gpus import gpu_spec
from nmgen.problem import ALayout
from nmgen.store.database import connect
from nmgen.tune.measurers import ModelMeasurer
from nmgen.tune.storage import open_storage
from nmgen.tune.task import TuneTask
from nmgen.tune.tuner import Tuner

task = TuneTask.of(gpu_spec("h100"), F32_SIMT, 8, 32, 32, ALayout.ROW_MAJOR, (256, 2048, 2048))
Tuner(connect(sys.argv[1]), open_storage(sys.argv[2]))._study(task, ModelMeasurer(task).key)
"""


def test_another_worker_reads_a_studys_seeds_from_the_storage(tmp_path, monkeypatch):
    """A study created (and seeded) by another process: this worker compiles its seeds
    ahead and opens it without ranking them; a study not yet created is ranked here, to
    compile only (it is created, and seeded, by the worker that tunes it first)."""
    import subprocess
    import sys

    from nmgen.tune import seeds as seeds_module
    from nmgen.tune import tuner as tuner_module
    from nmgen.tune.studies import stored_seeds

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    journal = f"journal:{tmp_path / 'studies.journal'}"
    subprocess.run([sys.executable, "-c", CREATE_STUDY, url, journal], check=True)
    created, fresh = (task_of("h100", n, 32, 32, ALayout.ROW_MAJOR, 256, 2048, 2048)
                      for n in (8, 4))
    monkeypatch.setattr(tuner_module.GpuMeasurer, "key_of",  # no device here
                        staticmethod(lambda task: ModelMeasurer(task).key))
    ranked: list[str] = []
    real_model_seeds = seeds_module.model_seeds
    monkeypatch.setattr(seeds_module, "model_seeds", lambda task, count: (
        ranked.append(task.study_name) or real_model_seeds(task, count)))
    pool = RecordingPool()
    tuner = Tuner(connect(url), open_storage(journal), ahead_workers=2, _compile_pool=pool)
    study = optuna.load_study(study_name=tuner.study_name(created), storage=tuner.storage)
    names, trials = stored_seeds(study), len(study.trials)
    assert names and tuner.stored_seeds(fresh) is None
    tuner.compile_ahead([created, fresh])
    assert ranked == [fresh.study_name]
    feasible = [n for n in names if F32_SIMT.feasible(KernelConfig.from_name(n),
                                                      created.gpu) is None]
    assert pool.queued[1] == feasible
    assert tuner._study(created, ModelMeasurer(created).key).study_name == study.study_name
    assert ranked == [fresh.study_name] and len(study.trials) == trials  # nothing added
    assert tuner.stored_seeds(fresh) is None  # ahead creates no study


def test_a_study_whose_creator_stopped_before_seeding_it_is_seeded_by_the_next(tmp_path,
                                                                            monkeypatch):
    """A worker that finds a study created but not seeded waits for its seeds; where none
    come (its creator stopped first) it seeds the study itself. A study with trials asked
    and no seeds stored (seeded before they were stored) is left as it is."""
    from nmgen.tune import studies
    from nmgen.tune.studies import await_seeds, stored_seeds

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    tuner = Tuner(connect(url), url, dry_run=True, log=lambda s: None)
    task = task_of("h100", 2, 4, 16, ALayout.ROW_MAJOR, 64, 256, 512)
    bare = optuna.create_study(study_name=tuner.study_name(task), storage=url)
    assert not await_seeds(bare, timeout_s=0.1)
    real_await = studies.await_seeds
    monkeypatch.setattr(studies, "await_seeds", lambda study: real_await(study, 0.1))
    study = tuner._study(task, ModelMeasurer(task).key)
    seeds = [c.name for c in tuner.seeds(task, ModelMeasurer(task).key)]
    assert stored_seeds(study) == seeds and len(study.trials) == len(seeds)
    assert await_seeds(study, timeout_s=0.0)
    old = optuna.create_study(study_name="seeded-before", storage=url)
    old.enqueue_trial({"x": 1.0})
    old.ask()
    assert await_seeds(old, timeout_s=0.0) and stored_seeds(old) is None


def test_cross_check_tries_the_winners_of_shapes_tuned_later(tmp_path):
    """The first shape tuned had no tuned neighbours; once a neighbour is tuned to a
    winner the first never tried, the cross-check measures that winner there and keeps
    the fastest, and a second cross-check measures nothing again."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    tuner = Tuner(connect(url), url, trials=4, batch=4, dry_run=True)
    first, later = (task_of("h100", 8, 32, 32, ALayout.ROW_MAJOR, *shape)
                    for shape in ((256, 2048, 2048), (512, 2048, 2048)))
    tuner.tune(first)
    key = ModelMeasurer(first).key

    def tried() -> list[str]:
        return [r.config_row.name for r in trials_of(tuner.engine, key)]

    untried = tried()
    winner = next(c for c in model_seeds(later, 20) if c.name not in untried)
    record_trial(tuner.engine, ModelMeasurer(later).key, winner, render(winner).sha256,
                 TrialStatus.MODEL, 1e-6, 1e-6)
    assert tuner.seeder().neighbours(first, key) == [winner]
    before, after = tuner.cross_check(first)
    assert winner.name in tried() and len(tried()) == len(untried) + 1
    assert after.time_ms <= before.time_ms
    assert after.time_ms == min(r.time_ms for r in trials_of(tuner.engine, key))
    tuner.cross_check(first)
    assert len(tried()) == len(untried) + 1


def test_seed_table_is_kept_on_disk(tmp_path, monkeypatch):
    """The model's table of a space is built once a machine and read back by the next
    process (past the in-process cache here), ranking alike; a broken file is rebuilt."""
    from nmgen.cache import cache_file
    from nmgen.families.base import rank_table
    from nmgen.tune.seeds import seed_table

    monkeypatch.setenv("NMGEN_CACHE_DIR", str(tmp_path))
    task = task_of("h100", 2, 4, 16, ALayout.ROW_MAJOR, 64, 256, 512)

    def build(t):
        return rank_table.__wrapped__(t.family, t.problem, t.gpu, t.space)

    fresh = build(task)
    sources = F32_SIMT.source_files()
    path = cache_file("rank", ("f32", task.gpu, task.problem, task.space), sources)
    assert path.is_relative_to(tmp_path) and path.exists()
    for _ in range(2):  # read back; then rebuilt from a broken file
        again = build(task)
        assert again is not fresh and again.configs == fresh.configs
        assert again.rank(300, 200, 100) == fresh.rank(300, 200, 100)
        path.write_bytes(b"not a pickle")
    # in memory, one table serves every shape of a problem
    assert seed_table(task) is seed_table(task_of("h100", 2, 4, 16, ALayout.ROW_MAJOR,
                                                     128, 512, 256))
    other = task_of("a100", 2, 4, 16, ALayout.ROW_MAJOR, 64, 256, 512)
    assert cache_file("rank", ("f32", other.gpu, other.problem, other.space),
                      sources) != path


def test_tma_is_searched_where_the_gpu_has_the_engine():
    """The bulk copy engine is a tuned parameter on sm_90 only, and a TMA configuration's
    parameters give it back."""
    h100 = task_of("h100", 8, 32, 32, ALayout.K_MAJOR, 1024, 4096, 4096)
    a100 = task_of("a100", 8, 32, 32, ALayout.K_MAJOR, 1024, 4096, 4096)
    assert h100.space.choices(h100.problem)["tma"] == (False, True)
    assert a100.space.choices(a100.problem)["tma"] == (False,)
    config = KernelConfig.from_name(
        "nm_spmm_f32_n8m32l32_ms128ns256ks64_mt16nt8_w8x4_nopack_s3_k1_km_tma_sm90")
    study = optuna.create_study()
    study.enqueue_trial(h100.space.values_of(config))
    assert suggest_config(study.ask(), h100) == config


def test_a_study_seeds_from_the_kernels_of_other_tuned_patterns(tmp_path):
    """Once 8:32 is tuned, a 2:8 study starts from its winners adapted to 2:8 (ranked by
    the calibrated model), beside the reference and the model's guesses; the shipped
    records serve a database of its own too (``transfer_engines``)."""
    from nmgen.store.database import shipped_db
    from nmgen.tune.seeds import SEEDS_FROM_TRANSFER

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    tuner = Tuner(connect(url), url, trials=8, batch=8, dry_run=True, log=lambda s: None)
    shape = (1024, 4096, 4096)
    donor = task_of("h100", 8, 32, 32, ALayout.ROW_MAJOR, *shape)
    tuner.tune(donor)
    winner = best_per_problem(tuner.engine, ModelMeasurer(donor).key,
                              TrialStatus.MODEL)[shape].config
    task = task_of("h100", 2, 8, 32, ALayout.ROW_MAJOR, *shape)
    key = ModelMeasurer(task).key
    moved = tuner.seeder().transferred(task, key)
    assert 1 <= len(moved) <= SEEDS_FROM_TRANSFER
    assert all((c.n, c.m, c.vec) == (2, 8, 32) for c in moved)
    assert F32_SIMT.adapt(winner, task.problem) in moved
    assert set(moved) <= set(tuner.seeds(task, key))
    assert tuner.seeder().transferred(donor, ModelMeasurer(donor).key) == []  # no other pattern
    none = Tuner(connect(url), url, dry_run=True, transfer_seed_count=0)
    assert none.seeder().transferred(task, key) == []
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    shipped = connect(f"sqlite:///{shipped_db()}", writable=False)
    fresh = Tuner(connect(empty), empty, dry_run=True, transfer_engines=(shipped,))
    assert all(c.m == 8 for c in fresh.seeder().transferred(task, ModelMeasurer(task).key))
    assert len(fresh.seeder().transferred(task, ModelMeasurer(task).key)) == SEEDS_FROM_TRANSFER


def test_quick_preset_trials_finalists_and_no_cross_check(tmp_path, monkeypatch):
    """``--quick``: 8 trials, fewer model seeds, two finalists, and a worker that skips
    the cross-check once its studies are done."""
    from nmgen.tune.command import QUICK_TRIALS, default_trials, tuner_options
    from nmgen.tune.workers import run_worker

    assert (default_trials(True), default_trials(False)) == (QUICK_TRIALS, 40)
    assert tuner_options(False) == {}
    options = tuner_options(True)
    assert options["finalists"] == 2 and options["cross_checks"] is False

    class Measured(Tuner):  # measured (not a dry run), by the model, as on a GPU
        def measurer(self, task):
            measurer = ModelMeasurer(task)
            measurer.measure = lambda config, model_ms: (TrialStatus.OK, model_ms, None)
            return measurer

        def cross_check(self, task, winners=None):
            checked.append(task)
            return None, None

    tasks = [task_of("h100", 2, 4, 32, ALayout.ROW_MAJOR, m, 1024, 1024) for m in (256, 512)]
    for quick in (False, True):
        checked: list = []
        url = f"sqlite:///{tmp_path / f'{quick}.db'}"
        tuner = Measured(connect(url), open_storage(f"journal:{tmp_path / f'{quick}.j'}"),
                         trials=default_trials(quick), log=lambda s: None,
                         **tuner_options(quick))
        report = run_worker(tuner, tasks, log=lambda s: None)
        assert report.complete == 2 and len(checked) == (0 if quick else 2)
        study = optuna.load_study(study_name=tuner.study_name(tasks[0]),
                                  storage=tuner.storage)
        assert len(study.trials) == (8 if quick else 40)


def test_remeasure_confirms_only_a_kernel_near_the_best(tmp_path):
    """A kernel measured after the finalists were confirmed is timed again beside them
    only where it came within CONFIRM_MARGIN of the best; a slower one is just recorded."""
    from nmgen.tune.tuner import CONFIRM_MARGIN

    task = task_of("h100", 8, 32, 32, ALayout.ROW_MAJOR, 256, 2048, 2048)
    best, slow, close = model_seeds(task, 3)
    times = {best.name: 1.0, slow.name: 1.0 + 3 * CONFIRM_MARGIN,
             close.name: 1.0 + CONFIRM_MARGIN / 2}

    class Fixed(ModelMeasurer):
        def measure(self, config, model_ms):
            return TrialStatus.MODEL, times[config.name], None

    class Counting(Tuner):
        confirmed = 0

        def measurer(self, task):
            return Fixed(task)

        def confirm(self, task, measurer):
            Counting.confirmed += 1
            return {}

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    tuner = Counting(connect(url), storage=None, dry_run=True)
    key = Fixed(task).key
    record_trial(tuner.engine, key, best, render(best).sha256, TrialStatus.MODEL, 1.0, 1.0)
    tuner.remeasure(task, [slow])
    assert Counting.confirmed == 0
    assert {r.config_row.name for r in trials_of(tuner.engine, key)} == {best.name, slow.name}
    tuner.remeasure(task, [slow, close])  # slow is known: only close is measured
    assert Counting.confirmed == 1
    assert best_per_problem(tuner.engine, key, TrialStatus.MODEL)[task.shape].config == best
