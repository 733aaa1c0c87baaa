"""Tuning workers: one process's walk over the problems, and ``--devices`` (one worker
process per GPU of this host, all filling the same studies through a shared storage).

Each worker walks round the list of problems (``walk_order``), so the workers start on
different shapes and then help wherever a study is still short of trials; under a time
budget, a first pass gives every study one batch before any gets more. A worker leaves
when every study has its trials; while others still run the last ones it waits, failing
stale trials (a dead worker's: ``liveness.fail_dead``, or heartbeats) so that they are
redone, and saying every ``WAIT_LOG_S`` whose trials it waits for.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from .liveness import fail_dead, fail_orphans, owner
from .storage import open_storage
from .studies import give_back_waiting
from .task import TuneTask
from .tuner import AHEAD_STUDIES, Phases, Tuner, TuneReport

CROSS_CHECK_CLAIM = "nmgen-cross-check"  # the studies that claim a problem's cross-check
POLL_S = 0.5  # a waiting worker looks again this often
RECLAIM_S = 2.0  # ... and for dead workers' running trials this often
WAIT_LOG_S = 10.0  # ... and says what it waits for this often


@dataclass
class WorkerReport:
    studies: int  # studies this worker added trials to
    complete: int  # studies with all their trials when it left
    total: int
    seconds: float
    phases: Phases  # its own and those of the studies it finished, summed


@dataclass
class _Flying:
    """A study under way in this worker: its steps and the batch now compiling."""

    task: TuneTask
    steps: Generator[Any, None, TuneReport]
    compiling: Any = None


@dataclass
class _Waiting:
    """What a worker with nothing left to ask waits for: the running trials of other
    workers, by worker id, as last looked at."""

    since: float | None = None  # when this wait began (None: working)
    next_check: float = 0.0  # when to look for dead workers' trials again
    next_log: float = 0.0
    trials: Counter = field(default_factory=Counter)  # running trials by worker id
    studies: int = 0  # studies they are in


Pick = tuple[TuneTask, float, str, Sequence[TuneTask]]  # task, budget, progress, upcoming


def run_worker(tuner: Tuner, tasks: Sequence[TuneTask], time_budget_s: float = math.inf,
               index: int = 0, count: int = 1,
               log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
               on_study_done: Callable[[], None] = lambda: None) -> WorkerReport:
    """Tune ``tasks`` (with other workers, through the tuner's storage) until every study
    has its trials or the budget is spent. ``tuner.in_flight`` studies go at once: while
    one study's batch compiles, another's is measured (tuning waited on compiles for 70 %
    of its time with one study at a time, docs/engineering-notes.md §9)."""
    start = time.monotonic()
    order = walk_order(tasks, index, count)
    worked: set[str] = set()
    phases = Phases()
    started_ahead = False

    def begin(pick: Pick) -> _Flying:
        nonlocal started_ahead
        task, budget_s, progress, upcoming = pick
        begun = time.monotonic()
        with phases("ahead"):
            queued = tuner.compile_ahead(upcoming)
        if not started_ahead and queued:  # the first call ranks the first studies' seeds
            started_ahead = True
            log(f"{queued} kernels queued ahead of the first studies in "
                f"{time.monotonic() - begun:.1f} s")
        log(f"[{tasks.index(task) + 1}/{len(tasks)}] {tuner.study_name(task)} "
            f"({progress}, {time.monotonic() - start:.0f} s)")
        worked.add(task.study_name)
        return _Flying(task, tuner.tune_steps(task, time_budget_s=budget_s))

    def step(study: _Flying) -> bool:
        """Run ``study`` to its next batch compiling (it goes last in ``flying``);
        ``False`` once it is done (it leaves)."""
        flying.remove(study)
        try:
            study.compiling = next(study.steps)
        except StopIteration as stop:
            for phase, seconds in stop.value.phases.seconds.items():
                phases.add(phase, seconds)
            on_study_done()
            return False
        flying.append(study)
        return True

    flying: list[_Flying] = []  # oldest batch first
    walk = _walk(tuner, order, time_budget_s, start,
                 lambda: {f.task.study_name for f in flying})
    paused = False  # the walk found nothing open: asked again once something changed
    waiting = _Waiting()
    while True:
        while len(flying) < max(1, tuner.in_flight) and not paused:
            with phases("walk"):
                pick = next(walk)
            paused = pick is None
            if pick is not None:
                flying.append(begin(pick))
                step(flying[-1])
                waiting.since = None
        if flying:  # a batch compiled (else the oldest, waited for) is measured
            ended = not step(next((f for f in flying if f.compiling.done()), flying[0]))
            paused = paused and not ended
            continue
        with phases("walk"):
            work = [(t, *tuner.open_work(t)) for t in order]  # (task, complete, running)
        unfinished = [t for t, complete, _ in work if complete < tuner.trials]
        out_of_time = time.monotonic() - start >= time_budget_s
        leaving = not unfinished or out_of_time
        busy = [t for t, _, running in work if running]
        if not busy:
            waiting.trials.clear()
        # Trials running elsewhere: a dead worker's are failed and enqueued again (also on
        # leaving, so that none is left running in a full study).
        if busy and (leaving or time.monotonic() >= waiting.next_check):
            waiting.next_check = time.monotonic() + RECLAIM_S
            with phases("wait"):
                failed = _fail_dead(tuner, busy, waiting, log)
            if failed:
                paused = False  # their retries are open now
                continue
        if leaving:
            if out_of_time and unfinished:
                log(f"time budget spent: {len(unfinished)} of {len(tasks)} studies short "
                    "of their trials")
            _give_back_seeds(tuner, [t for t in order if t not in unfinished])
            if not unfinished and not tuner.dry_run and tuner.cross_checks:
                with phases("cross-check"):
                    claim = _cross_check_claims(tuner, tasks) if count > 1 else None
                    _cross_check(tuner, cross_check_order(tasks, index, count), log, claim)
            return WorkerReport(len(worked), len(tasks) - len(unfinished), len(tasks),
                                time.monotonic() - start, phases)
        now = time.monotonic()
        waiting.since = now if waiting.since is None else waiting.since
        if now >= waiting.next_log and waiting.trials:
            waiting.next_log = now + WAIT_LOG_S
            log(_waiting_line(waiting, now))
        with phases("wait"):  # the rest is running elsewhere: wait for it (or its failure)
            time.sleep(POLL_S)
        paused = False


def _fail_dead(tuner: Tuner, tasks: Sequence[TuneTask], waiting: _Waiting,
               log: Callable[[str], None]) -> int:
    """Fail the running trials of dead workers in ``tasks``' studies and enqueue their
    retries (``liveness.fail_dead``); notes in ``waiting`` whose trials still run. Returns
    how many were failed."""
    failed: Counter = Counter()
    waiting.trials, waiting.studies = Counter(), 0
    for task in tasks:
        try:
            study = optuna.load_study(study_name=tuner.study_name(task), storage=tuner.storage)
        except KeyError:
            continue
        dead, running = fail_dead(study)
        failed.update(owner(t) for t in dead)
        waiting.trials.update(owner(t) for t in running)
        waiting.studies += bool(running)
    count = sum(failed.values())
    if count:
        log(f"{count} running trial{'s' * (count != 1)} of dead "
            f"worker{'s' * (len(failed) != 1)} {_by_worker(failed)} failed and enqueued again")
    return count


def _by_worker(trials: Counter) -> str:
    return ", ".join(f"{worker} ({count})" for worker, count in sorted(trials.items()))


def _waiting_line(waiting: _Waiting, now: float) -> str:
    """``waiting for 3 running trials of 2 studies, workers h:12 (2), h:34 (1); 10 s so far``"""
    trials = sum(waiting.trials.values())
    return (f"waiting for {trials} running trial{'s' * (trials != 1)} of {waiting.studies} "
            f"stud{'ies' if waiting.studies != 1 else 'y'}, "
            f"worker{'s' * (len(waiting.trials) != 1)} {_by_worker(waiting.trials)}; "
            f"{now - (waiting.since or now):.0f} s so far")


def _walk(tuner: Tuner, order: Sequence[TuneTask], time_budget_s: float, start: float,
          busy: Callable[[], set[str]]) -> Iterator[Pick | None]:
    """The studies to work on: the next in ``order`` that no worker has begun, while there
    is one; then, in passes over ``order``, the next one open (short of trials, not among
    ``busy()``, the names of those under way here) or ``None`` at the end of a pass, to
    be asked again once something changed. Under a time budget a first pass gives every
    untouched study one batch before any gets a second, so that a tight budget tunes
    every shape a little, not some shapes well."""
    if math.isfinite(time_budget_s):
        for i, task in enumerate(order):
            if time.monotonic() - start >= time_budget_s:
                break
            if task.study_name not in busy() and _unasked(tuner, task) == tuner.trials:
                yield task, 0.0, f"first pass {i + 1}/{len(order)}", order[i:i + 1 + AHEAD_STUDIES]
    yield from _untouched(tuner, order, time_budget_s, start)
    while True:
        here = busy()
        open_tasks = [t for t in order if t.study_name not in here and _unasked(tuner, t) > 0]
        for i, task in enumerate(open_tasks, 1):
            left = time_budget_s - (time.monotonic() - start)
            if left <= 0:
                break
            if task.study_name in busy() or _unasked(tuner, task) <= 0:
                continue  # filled by others meanwhile
            done = len(order) - len(open_tasks) + i - 1
            yield (task, left / (len(open_tasks) - i + 1),
                          f"{done} of {len(order)} done or taken",
                          open_tasks[i - 1:i + AHEAD_STUDIES])
        yield from _joins(tuner, order, time_budget_s, start, busy)
        yield None


def _untouched(tuner: Tuner, order: Sequence[TuneTask], time_budget_s: float, start: float
               ) -> Iterator[Pick]:
    """The studies of ``order`` that no worker has asked a trial of yet, in order, each
    looked at once, when the walk reaches it (a study begun stays begun). Workers join
    each other's studies only once none is left untouched: a worker that joins a study
    makes its problem's data too, and four GPUs' workers joined 33 of 100 studies (143
    data makes), beginning while 13 studies were still untouched
    (docs/engineering-notes.md §10)."""
    begun = 0
    for i, task in enumerate(order):
        left = time_budget_s - (time.monotonic() - start)
        if left <= 0:
            return
        if _unasked(tuner, task) < tuner.trials:
            begun += 1
            continue
        untouched = len(order) - begun
        begun += 1
        yield (task, left / untouched, f"{len(order) - untouched} of {len(order)} begun",
               order[i:i + 1 + AHEAD_STUDIES])


def _joins(tuner: Tuner, order: Sequence[TuneTask], time_budget_s: float, start: float,
           busy: Callable[[], set[str]]) -> Iterator[Pick]:
    """Nothing else is open: the studies under way here that still have trials to ask,
    most first, each again while it has (the caller stops asking once its studies at once
    are going). Their batches then run side by side, as two workers' batches of one study
    do, instead of one after another at the end of the run (a study's last batches were
    the tail of a run: docs/engineering-notes.md §9)."""
    here = busy()
    for task in sorted((t for t in order if t.study_name in here),
                       key=lambda t: _unasked(tuner, t), reverse=True):
        for _ in range(max(1, tuner.in_flight)):
            left = time_budget_s - (time.monotonic() - start)
            if left <= 0 or _unasked(tuner, task) <= 0:
                break
            yield task, left, "another batch of a study under way here", ()


def _unasked(tuner: Tuner, task: TuneTask) -> int:
    """Trials of ``task``'s study that no worker has asked for yet (neither complete nor
    running)."""
    return tuner.trials - sum(tuner.open_work(task))


def walk_order(tasks: Sequence[TuneTask], index: int, count: int) -> list[TuneTask]:
    """The order worker ``index`` of ``count`` takes the problems in. Workers go in pairs:
    the even one walks forward from the start of the pair's share (``2/count`` of the
    list), the odd one backward from its end, so that they meet in the middle (with an
    odd count the last worker walks its share alone). A shapes file lists related shapes
    together (M ascending, say); two workers that start on related shapes compile the same
    kernels side by side. Started at the two ends, two workers compiled about as many
    kernels as one (docs/engineering-notes.md §10; no wall-time gain
    was measured, the host's drift being larger)."""
    size, count = len(tasks), max(count, 1)
    if index % 2 == 0:
        first = index * size // count
        return list(tasks[first:]) + list(tasks[:first])
    stop = min(index + 1, count) * size // count  # the end of the pair's share
    return (list(tasks[stop:]) + list(tasks[:stop]))[::-1]


def cross_check_share(tasks: Sequence[TuneTask], index: int, count: int) -> list[TuneTask]:
    """The problems worker ``index`` of ``count`` cross-checks once every study is
    complete: the ``index``-th of ``count`` contiguous runs of about equal cost, so that
    each problem is cross-checked once and the workers finish together. A run is about
    what the worker tuned itself (``walk_order``: a pair of workers meet in the middle of
    their share), whose kernels its process holds loaded already. A problem's cost is a
    fixed part (its data made, its kernels loaded) and timings that grow with M·N·K: runs
    cut by count took 14.5 and 25.9 s on two GPUs, the second half holding the large
    shapes (docs/engineering-notes.md §10). The others take what a worker has not begun
    once theirs are done (``cross_check_order``)."""
    count = max(count, 1)
    work = [math.prod(t.shape) for t in tasks]
    mean = sum(work) / len(work) if work else 1.0
    weights = [1.0 + w / mean for w in work]  # as much fixed as the mean problem's timings
    total, before, share = sum(weights), 0.0, []
    for task, weight in zip(tasks, weights, strict=True):
        if min(count - 1, int((before + weight / 2) * count / total)) == index:
            share.append(task)
        before += weight
    return share


def cross_check_order(tasks: Sequence[TuneTask], index: int, count: int) -> list[TuneTask]:
    """The problems worker ``index`` of ``count`` offers to cross-check, in order: its
    share (``cross_check_share``), then the other shares from their ends, one problem of
    each in turn. Each problem is claimed before it is checked (``_cross_check_claims``),
    so a worker done with its share takes the last problems of those whose workers are
    still going through theirs from the start: the workers finish together, where the
    shares alone, costed by shape, took 4.9-9.9 s each of four GPUs (one whole pass 26 s,
    docs/engineering-notes.md §10)."""
    count = max(count, 1)
    others = [cross_check_share(tasks, j % count, count)[::-1]
              for j in range(index + 1, index + count)]
    return cross_check_share(tasks, index, count) + [
        task for turn in itertools.zip_longest(*others) for task in turn if task is not None]


def _cross_check_claims(tuner: Tuner, tasks: Sequence[TuneTask]) -> Callable[[TuneTask], bool]:
    """Whether this worker is the one to cross-check a problem: the first to create its
    claim (an empty study in the shared storage; of workers creating one at once exactly
    one does). A claim names this pass by the trials of the tune's studies, which no
    worker adds to once all are complete, so that a later tune on the same storage
    (more trials, more shapes, a killed run's redone trials) claims its problems anew."""
    from .studies import claim

    trials = 0
    for task in tasks:
        study = optuna.load_study(study_name=tuner.study_name(task), storage=tuner.storage)
        trials += len(study.get_trials(deepcopy=False))
    return lambda task: claim(tuner.storage, f"{CROSS_CHECK_CLAIM}:{trials}:"
                                             f"{tuner.study_name(task)}")


def _cross_check(tuner: Tuner, tasks: Sequence[TuneTask], log: Callable[[str], None],
                 claim: Callable[[TuneTask], bool] | None = None) -> None:
    """Every study is complete: each of ``tasks`` (those of them that this worker
    ``claim``s, where workers share them) tries its tuned neighbours' winners
    (``Tuner.cross_check``), all winners read once."""
    changed = []
    checked = 0
    winners: dict[tuple, dict] = {}  # every shape's winner, by problem less its shape
    for task in tasks:
        if claim is not None and not claim(task):
            continue
        checked += 1
        key = tuner.problem_key(task)
        if key.without_shape() not in winners:
            winners[key.without_shape()] = tuner.winners(key)
        before, after = tuner.cross_check(task, winners[key.without_shape()])
        if before and after and after.config != before.config:
            changed.append(f"{tuner.study_name(task)}: {before.time_ms:.4f} ms -> "
                           f"{after.time_ms:.4f} ms {after.config.name}")
    log(f"cross-check of {checked} problems against their neighbours' winners: "
        f"{len(changed)} winners changed" + "".join(f"\n  {line}" for line in changed))


def _give_back_seeds(tuner: Tuner, full: Sequence[TuneTask]) -> None:
    """Seeds enqueued in studies that were full by then (``give_back_waiting``)."""
    for task in full:
        study = optuna.load_study(study_name=tuner.study_name(task), storage=tuner.storage)
        give_back_waiting(study, tuner.trials)


def supervise(child_argv: Callable[[int, str], list[str]], devices: Sequence[str],
              storage_url: str, log: Callable[[str], None]) -> int:
    """Run one worker process per device (``CUDA_VISIBLE_DEVICES`` set to it) and wait.
    A worker that dies has its running trials failed and re-enqueued for the others."""
    host = socket.gethostname()  # a worker's id is host:pid (liveness.worker_id)
    procs = {}
    for i, device in enumerate(devices):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": device,
               "NMGEN_LOCAL_WORKERS": str(len(devices))}  # they share the host's cores
        procs[device] = subprocess.Popen([sys.executable, "-m", "nmgen.cli",
                                          *child_argv(i, device)], env=env)
        log(f"worker {i} on GPU {device}: pid {procs[device].pid}")
    failures, start = 0, time.monotonic()
    while procs:
        time.sleep(0.2)
        for device, proc in list(procs.items()):
            code = proc.poll()
            if code is None:
                continue
            del procs[device]
            log(f"worker on GPU {device} exited after {time.monotonic() - start:.1f} s")
            if code != 0:
                failures += 1
                orphans = fail_orphans(open_storage(storage_url), f"{host}:{proc.pid}")
                log(f"worker on GPU {device} (pid {proc.pid}) exited with {code}; "
                    f"{orphans} of its running trials failed and enqueued again")
    return 1 if failures else 0
