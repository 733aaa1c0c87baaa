"""Worker liveness: a worker that dies must not leave a trial running forever.

On an RDB storage Optuna's heartbeats do it: every running trial beats while it is
measured (``heartbeat``), and any worker fails trials whose beat went stale and enqueues a
retry (``fail_stale``). The journal storage has no heartbeats, so there the parent of the
``--devices`` workers does the same for a child that exits abnormally
(:func:`fail_orphans`), and a waiting worker (a re-run of a killed ``nmgen tune``, the
survivor of hand-started workers) does it for the trials of any worker of its host whose
process is gone (:func:`fail_dead`), on every storage. A trial names the worker that
runs it from the moment it is asked (:func:`ask`).
"""

from __future__ import annotations

import copy
import os
import socket
import threading
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import optuna
from optuna.storages import BaseStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import TrialState

# Seconds between heartbeats, and without one before a trial counts as dead (the tests
# shorten both through the environment).
HEARTBEAT_S = int(os.environ.get("NMGEN_HEARTBEAT_S", "5"))
GRACE_S = int(os.environ.get("NMGEN_HEARTBEAT_GRACE_S", "30"))
MAX_RETRY = 3


@contextmanager
def quiet() -> Iterator[None]:
    """Optuna marks heartbeats experimental and warns when they are used without
    ``Study.optimize``; nmgen uses them through ask-and-tell on purpose."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        yield


# The trials this process asked, (study name, trial id): a trial that names this process
# as its worker but is not among them was asked by an earlier process of the same pid (a
# re-run in a fresh container, say), now dead.
_ASKED: set[tuple[str, int]] = set()


def ask(study: optuna.Study) -> optuna.Trial:
    """A new trial, beating at once and named at once (user attribute ``worker``:
    ``worker_id``): Optuna counts a running trial as stale only once it has a heartbeat,
    and a trial names the process that runs it so that its death is seen (``is_dead``).
    A worker killed before either would leave the trial running until the grace period."""
    with quiet():
        trial = study.ask()
    _ASKED.add((study.study_name, trial._trial_id))
    if uses_heartbeats(study._storage):
        study._storage.record_heartbeat(trial._trial_id)
    trial.set_user_attr("worker", worker_id())
    return trial


def worker_id() -> str:
    """Who runs a trial: stored on it so that a dead worker's trials can be found."""
    return f"{socket.gethostname()}:{os.getpid()}"


def uses_heartbeats(storage: BaseStorage) -> bool:
    """True for an RDB storage with heartbeats, also behind Optuna's caching wrapper."""
    return isinstance(storage, BaseHeartbeat) and storage.get_heartbeat_interval() is not None


@contextmanager
def heartbeat(storage: BaseStorage, trials: Iterable[optuna.Trial]) -> Iterator[None]:
    """Beat for ``trials`` from a background thread while the block runs (a batch's
    compile and measurement can take longer than the grace period)."""
    if not uses_heartbeats(storage):
        yield
        return
    ids = [t._trial_id for t in trials]
    stop = threading.Event()

    def beat() -> None:
        while True:
            for trial_id in ids:
                storage.record_heartbeat(trial_id)
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beat, daemon=True, name="nmgen-heartbeat")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def fail_stale(study: optuna.Study) -> None:
    """Fail trials whose worker stopped beating (RDB storages) and enqueue their retry."""
    if uses_heartbeats(study._storage):
        _beat_unbeaten(study)
    with quiet():
        optuna.storages.fail_stale_trials(study)


def _beat_unbeaten(study: optuna.Study) -> None:
    """A worker killed between asking a trial and its first heartbeat (``ask``) leaves a
    running trial that Optuna never counts stale, as it fails only trials whose heartbeat
    went stale; the other workers then wait for it for ever (1 run in 12 of
    ``test_killed_worker_loses_nothing_and_its_trial_is_redone``). Such a trial, once
    older than the grace period, gets a first heartbeat here: nobody beats it again, so a
    later check fails it and enqueues its retry. (The heartbeat table is Optuna's own.)"""
    from optuna.storages._rdb.models import TrialHeartbeatModel
    from sqlalchemy import select

    rdb = getattr(study._storage, "_backend", study._storage)  # behind the caching wrapper
    grace = rdb.grace_period or 2 * rdb.heartbeat_interval
    cutoff = datetime.now() - timedelta(seconds=grace)  # datetime_start: local, naive
    old = [t._trial_id for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
           if t.datetime_start is not None and t.datetime_start < cutoff]
    if not old:
        return
    with rdb.engine.connect() as conn:
        beaten = set(conn.scalars(select(TrialHeartbeatModel.trial_id)
                                  .where(TrialHeartbeatModel.trial_id.in_(old))))
    for trial_id in old:
        if trial_id not in beaten:
            rdb.record_heartbeat(trial_id)


class _Retry(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a failed running trial (a waiting copy of its parameters), less
    the user attributes that named its worker: once asked, the retry is its new worker's,
    and until that one names itself it must not look like the dead worker's trial."""

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        trial = copy.copy(trial)
        trial.user_attrs = {k: v for k, v in trial.user_attrs.items()
                            if k not in ("worker", "surplus")}
        super().__call__(study, trial)


def stale_trial_retry() -> _Retry:
    with quiet():
        return _Retry(MAX_RETRY)


def _fail_and_retry(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
    """Fail a dead worker's running trial and enqueue its retry; ``False`` where another
    worker (or the trial's own) finished it first: only one of them enqueues the retry."""
    storage = study._storage
    try:
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    stale_trial_retry()(study, storage.get_trial(trial._trial_id))
    return True


def fail_orphans(storage: BaseStorage, dead_worker: str) -> int:
    """Fail the running trials of a worker known to be dead, enqueue a retry of each
    (what heartbeats do on an RDB storage); returns how many."""
    failed = 0
    for summary in storage.get_all_studies():
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if trial.user_attrs.get("worker") == dead_worker:
                failed += _fail_and_retry(study, trial)
    return failed


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs (a zombie, killed but not yet
    reaped by its parent, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


def owner(trial: optuna.trial.FrozenTrial) -> str:
    """The worker id a running trial names (``worker_id``), ``unnamed`` before it has one."""
    return str(trial.user_attrs.get("worker", "unnamed"))


def is_dead(study: optuna.Study, trial: optuna.trial.FrozenTrial, grace_s: float = GRACE_S,
            host: str | None = None) -> bool:
    """Whether running ``trial`` belongs to a dead worker: one of this host whose process is
    gone (or that has this process's pid but is not this process: an earlier run's), or,
    on a storage without heartbeats, none yet (its worker died between asking it and
    naming itself) once the trial is older than ``grace_s``. Other hosts' workers cannot
    be looked at: on an RDB storage their heartbeats tell (``fail_stale``)."""
    if (study.study_name, trial._trial_id) in _ASKED:
        return False  # this process's own
    worker = trial.user_attrs.get("worker")
    if worker is None:
        start = trial.datetime_start  # local, naive
        return (not uses_heartbeats(study._storage) and start is not None
                and datetime.now() - start > timedelta(seconds=grace_s))
    name, _, pid = str(worker).rpartition(":")
    if name != (host or socket.gethostname()) or not pid.isdigit():
        return False
    return int(pid) == os.getpid() or not pid_alive(int(pid))


def fail_dead(study: optuna.Study, grace_s: float = GRACE_S
              ) -> tuple[list[optuna.trial.FrozenTrial], list[optuna.trial.FrozenTrial]]:
    """Fail the running trials of dead workers (``is_dead``) and enqueue a retry of each,
    as ``fail_orphans`` does; returns (those failed here, those still running)."""
    host = socket.gethostname()
    failed, running = [], []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not is_dead(study, trial, grace_s, host):
            running.append(trial)
        elif _fail_and_retry(study, trial):
            failed.append(trial)
    return failed, running
