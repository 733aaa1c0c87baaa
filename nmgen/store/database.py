"""Opening the tuned database: SQLite by default (``NMGEN_DB`` or
``~/.cache/nmgen/tuned.db``), any SQLAlchemy URL with ``--db``; the database shipped with
nmgen is read after the user's."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from .tables import Base

SHIPPED_DB = Path(__file__).resolve().parent.parent / "tuned_db" / "tuned.sqlite"


def shipped_db() -> Path:
    """The tuned results shipped with nmgen (package data, ``nmgen/tuned_db/``)."""
    return SHIPPED_DB


def default_url() -> str:
    path = os.environ.get("NMGEN_DB") or str(Path.home() / ".cache" / "nmgen" / "tuned.db")
    if "://" in path:
        return path
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def connect(url: str | None = None) -> Engine:
    url = url or default_url()
    if url.startswith("sqlite"):  # several worker processes of one host may write
        engine = create_engine(url, connect_args={"timeout": 60})
        event.listen(engine, "connect", _sqlite_wal)
    else:
        engine = create_engine(url, pool_pre_ping=True)
    # Workers starting together race to create the tables.
    retry_on_race(lambda: Base.metadata.create_all(engine), attempts=3)
    return engine


RACE_ERRORS = (IntegrityError, OperationalError, ProgrammingError)
T = TypeVar("T")


def retry_on_race(action: Callable[[], T], attempts: int,
                  errors: tuple[type[Exception], ...] = RACE_ERRORS, delay_s: float = 0.2) -> T:
    """``action()``, tried again where concurrent workers collided on creating the same
    tables or unique rows (the loser sees one of ``errors``); the last failure is raised."""
    for attempt in range(attempts - 1):
        try:
            return action()
        except errors:
            time.sleep(delay_s * (attempt + 1))
    return action()


def _sqlite_wal(dbapi_connection, _record) -> None:
    """Write-ahead logging, so that readers and the one writer of the moment do not block
    each other; with it, ``synchronous=NORMAL`` (SQLite's advice for WAL) syncs at
    checkpoints instead of every commit: a killed worker still loses no committed row, a
    power cut may lose the last ones (a re-run measures them again)."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
