"""Optuna storages that several tuning workers share, and what keeps them honest.

- One process: the RDB storage at the tuned database's URL (SQLite by default).
- Several workers on one host: Optuna's journal storage (``journal:PATH``, a file with a
  lock), the default for ``--devices`` when the database is SQLite.
- Several hosts: an RDB storage on a database server (``postgresql+psycopg://...``).

A worker that dies must not leave a trial running forever. On an RDB storage Optuna's
heartbeats do it: every running trial beats while it is measured, and any worker fails
trials whose beat went stale and enqueues a retry. The journal storage has no
heartbeats, so there the parent of the ``--devices`` workers does the same for a child
that exits abnormally (:func:`fail_orphans`), and a waiting worker (a re-run of a killed
``nmgen tune``, the survivor of hand-started workers) does it for the trials of any
worker of its host whose process is gone (:func:`fail_dead`), on every storage.

A study's seeds are ranked once for all workers: the worker that creates the study
(:func:`open_study`) enqueues them and stores their names in it (:func:`seed_study`); the
others read them there (:func:`stored_seeds`, :func:`await_seeds`).
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import optuna
from optuna.storages import (
    BaseStorage,
    JournalStorage,
    RDBStorage,
    RetryHeartbeatStaleTrialCallback,
)
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.storages.journal._storage import JournalOperation
from optuna.trial import TrialState

from ..store.database import retry_on_race

JOURNAL_PREFIX = "journal:"
# Seconds between heartbeats, and without one before a trial counts as dead (the tests
# shorten both through the environment).
HEARTBEAT_S = int(os.environ.get("NMGEN_HEARTBEAT_S", "5"))
GRACE_S = int(os.environ.get("NMGEN_HEARTBEAT_GRACE_S", "30"))
MAX_RETRY = 3
SEEDS_ATTR = "seeds"  # a study's user attribute: the names of the configurations it starts from
SEEDS_WAIT_S = 30.0  # how long a worker waits for the seeds of a study another one created
SEEDS_POLL_S = 0.05
_ASKED_STATES = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


class StorageError(ValueError):
    """A storage that cannot serve the requested workers."""


@contextmanager
def _quiet() -> Iterator[None]:
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
    with _quiet():
        trial = study.ask()
    _ASKED.add((study.study_name, trial._trial_id))
    if uses_heartbeats(study._storage):
        study._storage.record_heartbeat(trial._trial_id)
    trial.set_user_attr("worker", worker_id())
    return trial


def worker_id() -> str:
    """Who runs a trial: stored on it so that a dead worker's trials can be found."""
    return f"{socket.gethostname()}:{os.getpid()}"


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def default_storage_url(db_url: str) -> str:
    """A journal file beside a SQLite database (safe for the workers of one host; for one
    worker faster than Optuna's RDB storage on SQLite, which commits every parameter:
    docs/engineering-notes.md §9); the database server itself when there is one."""
    if is_sqlite(db_url):
        path = db_url.split("///", 1)[1] if "///" in db_url else "nmgen-optuna"
        return f"{JOURNAL_PREFIX}{path}.optuna-journal"
    return db_url


def check_storage(url: str, workers: int) -> None:
    if workers > 1 and is_sqlite(url):
        raise StorageError(
            f"--storage {url}: Optuna's RDB storage on SQLite is not safe for {workers} "
            "worker processes; use --storage journal:PATH (one host) or a database server "
            "URL such as postgresql+psycopg://user@host/db (several hosts)")


def open_storage(url: str, heartbeat_s: int = HEARTBEAT_S,
                 grace_s: int = GRACE_S) -> BaseStorage:
    if url.startswith(JOURNAL_PREFIX):
        return HeldJournalStorage(JournalFile(url[len(JOURNAL_PREFIX):]))
    if is_sqlite(url):  # one writer: no heartbeats needed
        return RDBStorage(url)
    def rdb() -> RDBStorage:
        with _quiet():
            return RDBStorage(url, heartbeat_interval=heartbeat_s, grace_period=grace_s,
                              heartbeat_stale_trial_callback=_retry())

    # Fresh database: workers starting together race to make the tables.
    return retry_on_race(rdb, attempts=5, delay_s=0.5)


class JournalFlock(JournalFileOpenLock):
    """The journal's lock as an advisory ``flock`` on a file beside it: the waiting worker
    sleeps in the kernel until the lock is free, where Optuna's file locks make and remove
    a file or symlink and poll. ``flock`` excludes other processes (local file systems:
    the journal serves one host's workers); a thread lock, this process's other threads."""

    def __init__(self, journal_path: str) -> None:  # none of the parent's lock-file state
        self._path = journal_path + ".flock"
        self._fd: int | None = None
        self._threads = threading.Lock()

    def acquire(self) -> bool:
        self._threads.acquire()
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
        finally:
            self._threads.release()


class JournalFile(JournalFileBackend):
    """Optuna's journal file without an ``fsync`` after each record. Optuna writes a
    record for every parameter a trial suggests, and the syncs were about half of a
    worker's Optuna time, more with two workers on one disk (docs/engineering-notes.md §9).
    A record is in the operating system's hands once written, so a killed worker still
    loses nothing; only a crash of the host itself could."""

    def __init__(self, file_path: str) -> None:
        super().__init__(file_path, JournalFlock(file_path))

    def append_logs(self, logs: list[dict]) -> None:
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs)
        self._lock.acquire()
        try:
            with open(self._file_path, "ab") as f:
                f.write(text.encode("utf-8"))
        finally:
            self._lock.release()


# Records a block may hold back (``HeldJournalStorage.held``): none that the storage must
# read back before it answers (a new study or trial's id, a trial taken to run).
_HOLDABLE = (JournalOperation.SET_TRIAL_PARAM, JournalOperation.SET_TRIAL_USER_ATTR,
             JournalOperation.SET_TRIAL_SYSTEM_ATTR)


class HeldJournalStorage(JournalStorage):
    """Optuna's journal storage, whose records a block may hold back and append at once
    (``held``). Optuna appends a record for each parameter a trial suggests and each of
    its attributes, every one under the journal's lock and read back: 13 parameters and
    5 records of a result a trial, ~80,000 appends for 100 studies of 40 trials, each
    the lock taken once more by workers sharing the journal. Held, a trial's parameters
    are one append and its result another. The other workers see them a little later
    (as they would see a slower worker's); a worker killed inside a block loses its held
    records, as it would have lost those it had not reached: its trial is still running
    in the journal and is failed and redone as any dead worker's (``fail_dead``)."""

    def __init__(self, backend: JournalFileBackend) -> None:
        self._held = threading.local()  # before Optuna's first read of the journal
        super().__init__(backend)

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        del state["_held"]
        return state

    def __setstate__(self, state: dict) -> None:
        self._held = threading.local()
        super().__setstate__(state)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold this thread's records back until the block ends (or ``flush``), then
        append them at once; also when it raises: what was written stays written."""
        if getattr(self._held, "logs", None) is not None:  # nested: the outer block appends
            yield
            return
        self._held.logs = []
        try:
            yield
        finally:
            self.flush()
            self._held.logs = None

    def flush(self) -> None:
        """Append the records held so far (the block goes on holding)."""
        logs = getattr(self._held, "logs", None)
        self._held.unsynced = False
        if logs:
            with self._thread_lock:
                self._backend.append_logs(logs)
                logs.clear()
                self._sync_with_backend()

    def _write_log(self, op_code: int, extra_fields: dict[str, Any]) -> None:
        logs = getattr(self._held, "logs", None)
        finished = (op_code == JournalOperation.SET_TRIAL_STATE_VALUES
                    and TrialState(extra_fields["state"]).is_finished())
        if logs is None or not (op_code in _HOLDABLE or finished):
            if logs:  # an answer read back from the journal: what is held goes first
                self._backend.append_logs(logs)
                logs.clear()
            super()._write_log(op_code, extra_fields)
            return
        logs.append({"op_code": op_code, "worker_id": self._replay_result.worker_id,
                     **extra_fields})
        self._held.unsynced = True  # the read-back that follows the write: none

    def _sync_with_backend(self) -> None:
        if getattr(self._held, "unsynced", False):
            self._held.unsynced = False
            return
        super()._sync_with_backend()


@contextmanager
def writes_held(storage: BaseStorage) -> Iterator[Callable[[], None]]:
    """``HeldJournalStorage.held`` on a journal storage, giving its ``flush``; nothing
    held on others (a database server's storage writes each in a transaction of its
    own)."""
    if isinstance(storage, HeldJournalStorage):
        with storage.held():
            yield storage.flush
    else:
        yield lambda: None


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
    with _quiet():
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


def open_study(name: str, storage: BaseStorage | str, sampler: optuna.samplers.BaseSampler
               ) -> tuple[optuna.Study, bool]:
    """Study ``name`` (minimised), created where it does not exist yet, and whether this
    call created it: of workers opening a new study at once, exactly one creates it."""
    try:
        return optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                   direction="minimize"), True
    except optuna.exceptions.DuplicatedStudyError:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler), False


def claim(storage: BaseStorage | str, name: str) -> bool:
    """Whether this call is the first to claim ``name``: it creates an empty study of
    that name (of workers creating one at once exactly one does, as in ``open_study``)."""
    try:
        optuna.create_study(study_name=name, storage=storage,
                            sampler=optuna.samplers.RandomSampler())
    except optuna.exceptions.DuplicatedStudyError:
        return False
    return True


def seed_study(study: optuna.Study, params: Sequence[dict], names: Sequence[str]) -> None:
    """Enqueue a new study's seeds (their parameters ``params``), then store their
    ``names`` in it: a worker that waits for the names (``await_seeds``) then finds every
    seed enqueued."""
    for values in params:
        study.enqueue_trial(values, skip_if_exists=True)
    study.set_user_attr(SEEDS_ATTR, list(names))


def stored_seeds(study: optuna.Study) -> list[str] | None:
    """The names of the configurations ``study`` was seeded with; ``None`` before its
    creator stored them."""
    names = study.user_attrs.get(SEEDS_ATTR)
    return None if names is None else [str(name) for name in names]


def await_seeds(study: optuna.Study, timeout_s: float = SEEDS_WAIT_S) -> bool:
    """Whether ``study``, created by another worker, is seeded: its seeds stored (waited
    for up to ``timeout_s`` while its creator ranks them), or trials of it asked already
    (a study seeded before seeds were stored). ``False``: its creator stopped first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if SEEDS_ATTR in study.user_attrs or study.get_trials(deepcopy=False,
                                                             states=_ASKED_STATES):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(SEEDS_POLL_S)


def give_back_waiting(study: optuna.Study, trials: int) -> int:
    """Fail, unmeasured (user attribute ``surplus``), the enqueued trials still waiting in
    a study that has its ``trials`` complete; returns how many: seeds beyond its trials (a
    study of fewer trials than seeds), or those of a worker that seeded it late, its
    creator having stopped before storing its own (``await_seeds``). Nobody asks for them
    in a full study, so they would wait for ever, and none of them can be taken
    meanwhile."""
    if len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) < trials:
        return 0
    storage = study._storage
    given = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        try:
            storage.set_trial_user_attr(trial._trial_id, "surplus", True)
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        given += 1
    return given


class _Retry(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a failed running trial (a waiting copy of its parameters), less
    the user attributes that named its worker: once asked, the retry is its new worker's,
    and until that one names itself it must not look like the dead worker's trial."""

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        trial = copy.copy(trial)
        trial.user_attrs = {k: v for k, v in trial.user_attrs.items()
                            if k not in ("worker", "surplus")}
        super().__call__(study, trial)


def _retry() -> _Retry:
    with _quiet():
        return _Retry(MAX_RETRY)


def _fail_and_retry(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
    """Fail a dead worker's running trial and enqueue its retry; ``False`` where another
    worker (or the trial's own) finished it first: only one of them enqueues the retry."""
    storage = study._storage
    try:
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    _retry()(study, storage.get_trial(trial._trial_id))
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
