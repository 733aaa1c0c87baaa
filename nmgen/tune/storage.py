"""Optuna storages that several tuning workers share.

- One process: the RDB storage at the tuned database's URL (SQLite by default).
- Several workers on one host: Optuna's journal storage (``journal:PATH``, a file with a
  lock), the default for ``--devices`` when the database is SQLite; its records may be
  held back and appended at once (``writes_held``).
- Several hosts: an RDB storage on a database server (``postgresql+psycopg://...``), with
  heartbeats (``nmgen.tune.liveness``).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.storages.journal._storage import JournalOperation
from optuna.trial import TrialState

from ..store.database import retry_on_race
from .liveness import GRACE_S, HEARTBEAT_S, quiet, stale_trial_retry

JOURNAL_PREFIX = "journal:"


class StorageError(ValueError):
    """A storage that cannot serve the requested workers."""


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
        with quiet():
            return RDBStorage(url, heartbeat_interval=heartbeat_s, grace_period=grace_s,
                              heartbeat_stale_trial_callback=stale_trial_retry())

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
