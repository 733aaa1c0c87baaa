"""The tuner's loop: one Optuna study per (GPU, family, dtype, pattern, L, A layout,
shape), filled batch by batch, and the confirmation of its finalists.

The family's space gives the study its parameters; its model removes infeasible
configurations before anything is compiled (they reach Optuna as constraint violations,
not failed trials). A study starts from its seeds (``nmgen.tune.seeds``), ranked once a
study: the worker that creates it stores them in it for the others
(``nmgen.tune.studies``). Trials come in batches: the batch compiles in a process pool,
then each kernel is checked against the float64 reference once and timed with CUDA
events, one at a time. Once a study's batches are over, its fastest few are timed again
in turns (``Tuner.confirm``). Studies live in an Optuna storage (``nmgen.tune.storage``),
so a re-run resumes. The winner is read through ``nmgen.policy``.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import optuna
from sqlalchemy.engine import Engine

from ..codegen import render
from ..families.base import Config
from ..families.registry import config_from_dict
from ..policy import Winner, best_per_problem, pick_winner, reference_name
from ..store.records import ProblemKey, record_trial, shape_times, trials_of, update_times
from ..store.tables import GOOD, TrialStatus
from .measurers import INFEASIBLE_MS, GpuMeasurer, ModelMeasurer
from .seeds import (
    SEEDS_FROM_MODEL,
    SEEDS_FROM_TRANSFER,
    Seeder,
    nearest_winners,
    reference_seed,
)
from .task import TuneTask

# Finalists: the fastest few of a problem are timed again, in turns, before one wins. One
# timing a configuration picks the luckiest of dozens (bench and tuning runs disagreed by
# up to 78 % on short problems); the family's reference kernel is always among them.
FINALISTS = 3
FINAL_ROUNDS = 3
FINAL_BUDGET_MS = 200.0  # GPU time a confirmation aims at: big problems get fewer repeats
# A kernel measured once after the finalists were confirmed is confirmed beside them only
# where it came this near the best (timing noise is 1-4 %): the cross-check's timings
# were 0.2 s of its 0.43 s a problem.
CONFIRM_MARGIN = 0.05
CONFIRMED_ATTR = "confirmed_records"  # a study's user attribute: its problem's records
# when its finalists were last timed again (``Tuner._confirm_once``)
AHEAD_STUDIES = 3  # studies whose seeds compile ahead, in the spare processes


def default_ahead_workers(compile_workers: int) -> int:
    """Compile processes left over on this host once every local worker (the
    ``NMGEN_LOCAL_WORKERS`` that ``--devices`` starts) has its ``compile_workers`` and a
    core of its own; no more than ``compile_workers`` (three studies' seeds are ~30
    kernels: more processes would mostly wait)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    local = max(1, int(os.environ.get("NMGEN_LOCAL_WORKERS", "1")))
    return max(0, min(compile_workers, (cpus or 1) // local - compile_workers - 1))


def suggest_config(trial: optuna.Trial, task: TuneTask) -> Config | None:
    """The trial's configuration, or ``None`` where the values break a rule."""
    values = {name: trial.suggest_categorical(name, choices)
              for name, choices in task.space.choices(task.problem).items()}
    return task.space.config(task.problem, values)


def _tell(study: optuna.Study, trial: optuna.Trial, value: float, violation: float) -> None:
    """Report a result; ``violation > 0`` marks it infeasible (a constraint, not a failure)."""
    trial.set_constraint("valid", violation)
    trial.set_user_attr("violation", violation)
    study.tell(trial, value)


# ------------------------------------------------------------------ running
@dataclass
class Phases:
    """Where the time went, in seconds. A study's: setup (study, seeds), optuna (ask,
    suggest, tell), compile (waiting for its batch), data (the problem on the device),
    measure (check, time, record), confirm. A worker's own: walk (choosing the next study),
    ahead (queueing the next studies' seeds), wait (for other workers' trials),
    cross-check."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.add(phase, time.monotonic() - start)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items())

    def total(self) -> float:
        return sum(self.seconds.values())


@dataclass
class TuneReport:
    task: TuneTask
    trials: int
    measured: int
    winner: Winner | None
    seconds: float
    statuses: dict[str, int] = field(default_factory=dict)
    phases: Phases = field(default_factory=Phases)


PLANNED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING)


def run_steps(steps: Generator[Any, None, TuneReport]) -> TuneReport:
    """Run ``Tuner.tune_steps`` to its end, one study alone."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


@dataclass
class Tuner:
    """Fills one study per problem up to ``trials`` complete trials. Several tuners (in
    several processes or hosts) may fill the same study through a shared storage: each
    asks only for what is not yet done or running, and a trial asked beyond the plan in
    a race is given back unmeasured (state FAIL, user attribute ``surplus``)."""

    engine: Engine
    storage: Any  # optuna BaseStorage or URL
    trials: int = 40
    batch: int = 8
    workers: int = 8
    ahead_workers: int = 0  # compile processes for the next studies' seeds (0: none)
    # Studies a worker keeps going at once (workers.run_worker): eight took 0.78 of three's
    # wall on the H100 (docs/engineering-notes.md §9); more gained nothing.
    in_flight: int = 8
    dry_run: bool = False
    # The samplers' seed: the same in every worker of a tune, so that each study draws as
    # it would in one worker and studies of related shapes suggest the same kernels. With
    # a seed a worker, four dry-run workers asked for 241 distinct configurations against
    # 194 alone, 179-188 with one seed (docs/engineering-notes.md §10): kernels to compile.
    seed: int = 0
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)
    model_seed_count: int = SEEDS_FROM_MODEL  # the model's best guesses a study starts from
    transfer_seed_count: int = SEEDS_FROM_TRANSFER  # ... and other tuned problems' kernels
    finalists: int = FINALISTS  # the fastest few timed again before one wins
    cross_checks: bool = True  # try the neighbours' winners once every study is done
    # Other databases (read only) whose records transfer seeds come from: the shipped one
    transfer_engines: tuple = ()
    _compile_pool: Any = None
    _ahead_done: set = field(default_factory=set)  # study names whose seeds are queued
    _related: dict = field(default_factory=dict)  # transfer_engines' records, by key

    def study_name(self, task: TuneTask) -> str:
        return ("model-" if self.dry_run else "") + task.study_name

    def open_work(self, task: TuneTask) -> tuple[int, int]:
        """(complete, running) trials of ``task``'s study, (0, 0) before it exists."""
        from .liveness import fail_stale

        try:
            study = optuna.load_study(study_name=self.study_name(task), storage=self.storage)
        except KeyError:
            return 0, 0
        fail_stale(study)
        states = [t.state for t in study.get_trials(deepcopy=False, states=PLANNED)]
        running = states.count(optuna.trial.TrialState.RUNNING)
        return len(states) - running, running

    def measurer(self, task: TuneTask):
        return ModelMeasurer(task) if self.dry_run else GpuMeasurer(task, self._pool())

    def tune(self, task: TuneTask, time_budget_s: float = math.inf) -> TuneReport:
        """Fill ``task``'s study (within ``time_budget_s``, at least one batch)."""
        return run_steps(self.tune_steps(task, time_budget_s))

    def tune_steps(self, task: TuneTask, time_budget_s: float = math.inf
                   ) -> Generator[Any, None, TuneReport]:
        """``tune``, one batch at a time: yields each batch once its kernels are compiling
        (the object yielded has ``done()``) and, resumed, waits for them, measures and
        tells Optuna; returns the report. A worker measures one study's batch while
        another's compiles (``workers.run_worker``)."""
        start = time.monotonic()
        phases = Phases()
        with phases("setup"):
            measurer = self.measurer(task)
            study = self._study(task, measurer.key)
        statuses: dict[str, int] = {}
        batches = 0
        # The first batch (the model's seeds) always runs: every shape gets a winner, even
        # when setting the problem up used its share of the budget.
        while batches == 0 or time.monotonic() - start < time_budget_s:
            wanted = min(self.batch, self.trials - self._planned(study))
            if wanted <= 0:
                break
            batches += 1
            yield from self._run_batch(study, task, measurer, wanted, statuses, phases)
        measured = statuses.get(TrialStatus.OK, 0) + statuses.get(TrialStatus.MODEL, 0)
        self._confirm_once(study, task, measurer, measured, phases)
        data_s = getattr(measurer, "data_s", 0.0)  # measured inside the first measurement
        if data_s:
            phases.add("measure", -data_s)
            phases.add("data", data_s)
        winner = self.winner_of(measurer.key)
        report = TuneReport(task, self._done(study), measured, winner,
                            time.monotonic() - start, statuses, phases)
        best = (f"best {winner.time_ms:.4f} ms {winner.config.name}" if winner
                else "no correct kernel")
        self.log(f"{self.study_name(task)}: {report.trials} trials ({_here(statuses)}), "
                 f"{best} [{report.seconds:.2f} s: {phases}]")
        return report

    def remeasure(self, task: TuneTask, configs: Sequence[Config],
                  measurer=None) -> Winner | None:
        """Measure ``configs`` on ``task``'s problem where the database holds no result of
        them yet (kernels whose source a generator change altered: ``carry``), then time
        the finalists again in turns (``confirm``) where one of them came within
        ``CONFIRM_MARGIN`` of the best. Returns the problem's winner."""
        measurer = measurer or self.measurer(task)
        known = self._known(measurer.key)
        fresh = [c for c in dict.fromkeys(configs)
                 if c.name not in known and task.family.feasible(c, task.gpu) is None]
        best_ms = min((ms for status, ms in known.values() if status in GOOD),
                      default=math.inf)
        measurer.prepare(fresh)
        fresh_ms = [self._outcome(task, measurer, config, known)[1] for config in fresh]
        if fresh_ms and min(fresh_ms) <= best_ms * (1.0 + CONFIRM_MARGIN):
            self.confirm(task, measurer)
        return self.winner_of(measurer.key)

    @property
    def status(self) -> str:
        """The status of the trials that win: measured, or a dry run's estimates."""
        return TrialStatus.MODEL if self.dry_run else TrialStatus.OK

    def problem_key(self, task: TuneTask) -> ProblemKey:
        """The key ``task``'s results are stored under (its measurer's)."""
        return self.measurer(task).key

    def winners(self, key: ProblemKey) -> dict[tuple[int, int, int], Winner]:
        """The winner of every tuned shape of ``key``'s problem: one read of the database."""
        return best_per_problem(self.engine, key, self.status)

    def winner_of(self, key: ProblemKey) -> Winner | None:
        """The winner of ``key``'s shape alone (its trials only are read)."""
        times = shape_times(self.engine, key, self.status, only_shape=True).get(key.shape)
        if not times:
            return None
        time_ms, name = pick_winner([(t, n) for t, n, _ in times], reference_name(key))
        params = next(p for t, n, p in times if n == name)
        return Winner(config_from_dict(params), time_ms, key.shape)

    def cross_check(self, task: TuneTask, winners: dict | None = None
                    ) -> tuple[Winner | None, Winner | None]:
        """Once every study has its trials: measure on ``task``'s problem the winners of
        its nearest tuned shapes that it has not tried (shapes tuned after it, or beside
        it by another worker), then time the finalists again. Their kernels are compiled
        already, so this costs a few timings a shape, and a winner depends less on the
        order the shapes were tuned in: with two workers, a worker's first shape has no
        tuned neighbours to start from (docs/engineering-notes.md §10).
        ``winners``: every shape's winner (``winners``), read once for many problems and
        updated here with this problem's; read afresh without it.
        Returns the problem's winner before and after."""
        measurer = self.measurer(task)
        winners = self.winners(measurer.key) if winners is None else winners
        before = winners.get(measurer.key.shape)
        neighbours = [c for c in nearest_winners(measurer.key.shape, winners)
                      if task.space.contains(c)]
        after = self.remeasure(task, neighbours, measurer)
        if after is not None:
            winners[measurer.key.shape] = after
        return before, after

    def compile_ahead(self, tasks: Sequence[TuneTask]) -> int:
        """Queue the seeds of ``tasks`` (the studies to come) for the spare compile
        processes, once a study: those stored in a study that another worker created,
        else ranked here. Returns how many kernels were queued."""
        if self.dry_run or self.ahead_workers <= 0:
            return 0
        new = [t for t in tasks if t.study_name not in self._ahead_done]
        # Every study starts with the reference kernel, the slowest of its seeds to compile: it
        # goes first, as it needs no ranking of the space (the first ranking takes seconds).
        queued = self._pool().ahead([c for t in new for c in _feasible(t, reference_seed(t))])
        for task in new:
            self._ahead_done.add(task.study_name)
            seeds = self.stored_seeds(task)  # another worker's study: ranked there
            if seeds is None:  # no study yet: ranked here, to compile only
                seeds = self.seeds(task, GpuMeasurer.key_of(task))
            queued += self._pool().ahead(_feasible(task, seeds))
        return queued

    def stored_seeds(self, task: TuneTask) -> list[Config] | None:
        """The seeds that the worker that created ``task``'s study gave it (read from the
        storage); ``None`` before it has stored them."""
        from .studies import stored_seeds

        try:
            study = optuna.load_study(study_name=self.study_name(task), storage=self.storage)
        except KeyError:
            return None
        names = stored_seeds(study)
        if names is None:
            return None
        return [c for c in map(task.family.config_from_name, names) if c is not None]

    def _confirm_once(self, study: optuna.Study, task: TuneTask, measurer, measured: int,
                      phases: Phases) -> None:
        """Time the finalists again (``confirm``) once a study's batches are over, by the
        last worker out: none of the study's trials is running elsewhere (this worker's
        are told), and this worker, or another that left it to this one, measured since
        the last confirmation (the study's ``CONFIRMED_ATTR``: its problem's records
        then). Every worker that added a batch to a study confirmed before: 126
        confirmations for 100 studies on four GPUs, 24 s against 16.5 s on one
        (docs/engineering-notes.md §10). A worker that ends while another's trials still
        run leaves it to that one, which tells its trials before it looks, so that of two
        ending together at least one sees the other's told."""
        with phases("optuna"):
            if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                return
            confirmed = study.user_attrs.get(CONFIRMED_ATTR, 0)
        with phases("confirm"):
            rows = trials_of(self.engine, measurer.key)
            if measured or len(rows) > confirmed:
                self.confirm(task, measurer, rows)
                study.set_user_attr(CONFIRMED_ATTR, len(rows))

    def confirm(self, task: TuneTask, measurer, rows: Sequence[Any] | None = None
                ) -> dict[str, float]:
        """Time the problem's ``finalists`` fastest correct configurations and the reference
        kernel again, ``FINAL_ROUNDS`` times in turns, and store the medians: the winner is
        then read from these fairer times. Returns them. ``rows``: the problem's records,
        where read already."""
        rows = trials_of(self.engine, measurer.key) if rows is None else rows
        good = sorted((row.time_ms, row.config_row.name, row.config_row.params)
                      for row in rows if row.status in GOOD)
        finalists = {name: params for _, name, params in good[:self.finalists]}
        reference = task.family.reference_config(task.problem)
        if reference is not None:
            finalists.update((name, params) for _, name, params in good
                             if name == reference.name)
        if len(finalists) < 2:
            return {}
        slowest = max(t for t, name, _ in good if name in finalists)
        repeat = int(FINAL_BUDGET_MS / (len(finalists) * FINAL_ROUNDS * max(slowest, 1e-3)))
        try:
            times = measurer.retime([config_from_dict(p) for p in finalists.values()],
                                    FINAL_ROUNDS, max(3, min(15, repeat)))
        except Exception as exc:  # the earlier timings stand; the tuning goes on
            self.log(f"{self.study_name(task)}: finalists not timed again: "
                     f"{type(exc).__name__}: {exc}")
            return {}
        update_times(self.engine, measurer.key, times)
        return times

    def _run_batch(self, study: optuna.Study, task: TuneTask, measurer, wanted: int,
                   statuses: dict[str, int], phases: Phases) -> Generator[Any, None, None]:
        from .liveness import ask, heartbeat
        from .storage import writes_held

        with phases("optuna"):
            asked = [ask(study) for _ in range(wanted)]
        with heartbeat(study._storage, asked):
            with phases("optuna"):
                for trial in self._give_back_surplus(study, asked):
                    asked.remove(trial)
                configs = []
                for trial in asked:  # each trial's parameters in the storage before the next
                    with writes_held(study._storage):  # samples (its sampler sees them)
                        configs.append(suggest_config(trial, task))
            with phases("measure"):
                known = self._known(measurer.key)
            fresh = {c.name: c for c in configs if c is not None and c.name not in known
                     and task.family.feasible(c, task.gpu) is None}
            with phases("compile"):
                compiling = measurer.submit(list(fresh.values()))
            yield compiling
            with phases("compile"):  # what is left of it once the other studies had a turn
                measurer.take(compiling)
            with writes_held(study._storage) as flush:  # the batch's results: one append
                for trial, config in zip(asked, configs, strict=True):
                    with phases("measure"):
                        status, value, violation = self._outcome(task, measurer, config, known)
                    statuses[status] = statuses.get(status, 0) + 1
                    with phases("optuna"):
                        if config is not None:
                            trial.set_user_attr("config", config.name)
                            trial.set_user_attr("status", status)
                        _tell(study, trial, value, violation)
                with phases("optuna"):
                    flush()

    def _outcome(self, task: TuneTask, measurer, config: Config | None,
                 known: dict[str, tuple[str, float]]) -> tuple[str, float, float]:
        """(status, value, constraint violation) of one configuration, measured at most
        once per problem: a configuration already in the database keeps its result."""
        if config is None or task.family.feasible(config, task.gpu) is not None:
            return TrialStatus.INFEASIBLE, INFEASIBLE_MS, 1.0
        if config.name not in known:
            model_ms = task.family.estimate_ms(config, task.gpu, task.shape)
            status, value, error = measurer.measure(config, model_ms)
            held, held_ms = record_trial(self.engine, measurer.key, config, render(config).sha256,
                                         status, value if status in GOOD else None, model_ms,
                                         error)
            known[config.name] = (held, held_ms if held in GOOD else INFEASIBLE_MS)
        status, value = known[config.name]
        return status, value, 0.0 if status in GOOD else 1.0

    def _known(self, key: ProblemKey) -> dict[str, tuple[str, float]]:
        """Results this problem already has: the database's trials (any worker's)."""
        return {row.config_row.name: (row.status, row.time_ms if row.status in GOOD
                                      else INFEASIBLE_MS)
                for row in trials_of(self.engine, key)}

    def _give_back_surplus(self, study: optuna.Study,
                           asked: list[optuna.Trial]) -> list[optuna.Trial]:
        """Trials beyond the first ``trials`` planned ones (by number): another worker
        asked at the same time. They are failed unmeasured, never counted."""
        planned = sorted(t.number for t in study.get_trials(deepcopy=False, states=PLANNED))
        keep = set(planned[:self.trials])
        surplus = [t for t in asked if t.number not in keep]
        for trial in surplus:
            trial.set_user_attr("surplus", True)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return surplus

    def _pool(self):
        from ..compiler.pool import CompilePool

        if self._compile_pool is None:
            self._compile_pool = CompilePool(self.workers, self.ahead_workers)
            self._compile_pool.start()  # while the first study is set up
        return self._compile_pool

    def close(self) -> None:
        if self._compile_pool is not None:
            self._compile_pool.close()

    def compile_summary(self) -> str | None:
        """What the compile processes did (none started: ``None``)."""
        pool = self._compile_pool
        if pool is None:
            return None
        return (f"compiles for the batch timed next: {pool.batch_stats}; ahead: "
                f"{pool.ahead_stats}; {pool.taken_back} queued ahead, then compiled for "
                "the batch")

    def _study(self, task: TuneTask, key: ProblemKey) -> optuna.Study:
        """``task``'s study. The worker that creates it seeds it (``seeds``) and stores
        the seeds in it, so that they are ranked once a study, whatever the workers; a
        worker that finds it created waits for them, and seeds it itself only where its
        creator stopped first."""
        from .studies import await_seeds, open_study, seed_study

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=self.seed,
                                             n_startup_trials=max(1, self.model_seed_count))
        study, created = open_study(self.study_name(task), self.storage, sampler)
        if created or not await_seeds(study):
            seeds = self.seeds(task, key)
            seed_study(study, [task.space.values_of(c) for c in seeds], [c.name for c in seeds])
        return study

    def seeder(self) -> Seeder:
        """Where this tuner's studies start (``nmgen.tune.seeds``), by its settings as
        they are now; the transfer's records are kept across studies."""
        return Seeder(self.engine, self.status, self.model_seed_count,
                      self.transfer_seed_count, self.transfer_engines, self._related)

    def seeds(self, task: TuneTask, key: ProblemKey) -> list[Config]:
        """What ``task``'s study tries first (``Seeder.seeds``)."""
        return self.seeder().seeds(task, key)

    @staticmethod
    def _planned(study: optuna.Study) -> int:
        return len(study.get_trials(deepcopy=False, states=PLANNED))

    @staticmethod
    def _done(study: optuna.Study) -> int:
        return len(study.get_trials(deepcopy=False,
                                    states=(optuna.trial.TrialState.COMPLETE,)))


def _feasible(task: TuneTask, configs: Sequence[Config]) -> list[Config]:
    """Those of ``configs`` that fit ``task``'s GPU (the rest are never compiled)."""
    return [c for c in configs if task.family.feasible(c, task.gpu) is None]


def _here(statuses: dict[str, int]) -> str:
    """What this worker did to a study: trials timed, or a dry run's model estimates."""
    estimated = statuses.get(TrialStatus.MODEL, 0)
    if estimated:
        return f"{estimated} estimated by the model here, none measured"
    return f"{statuses.get(TrialStatus.OK, 0)} measured here"
