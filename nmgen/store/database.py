"""Opening the tuned database: SQLite by default (``NMGEN_DB`` or
``~/.cache/nmgen/tuned.db``), any SQLAlchemy URL with ``--db``; the database shipped with
nmgen is read after the user's."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import (
    ArgumentError,
    IntegrityError,
    NoSuchModuleError,
    OperationalError,
    ProgrammingError,
)
from sqlalchemy.exc import DatabaseError as SqlDatabaseError

from .tables import Base

SHIPPED_DB = Path(__file__).resolve().parent.parent / "tuned_db" / "tuned.sqlite"


def shipped_db() -> Path:
    """The tuned results shipped with nmgen (package data, ``nmgen/tuned_db/``)."""
    return SHIPPED_DB


class DatabaseError(ValueError):
    """A database nmgen cannot use; the message says which and why."""


def default_url() -> str:
    """``NMGEN_DB`` (a URL or a path), else ``~/.cache/nmgen/tuned.db``."""
    text = os.environ.get("NMGEN_DB")
    if text:
        return database_url(text)
    path = Path.home() / ".cache" / "nmgen" / "tuned.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def database_url(text: str) -> str:
    """A SQLAlchemy URL from what a user gives (``--db``, ``NMGEN_DB``): a URL as it is, a
    plain path as an SQLite file."""
    if "://" not in text:
        return f"sqlite:///{Path(text).expanduser()}"
    try:
        make_url(text)
    except ArgumentError:
        raise DatabaseError(f"{text!r} is neither a database URL (sqlite:///PATH, "
                            "postgresql+psycopg://USER@HOST/DB) nor a path") from None
    return text


def connect(url: str | None = None, writable: bool = True) -> Engine:
    """An engine on the database at ``url`` (default: ``default_url()``), its tables made
    where missing. ``writable=False`` opens an existing database to read (a SQLite file
    read-only) and makes nothing."""
    url = database_url(url) if url else default_url()
    if url.startswith("sqlite"):  # several worker processes of one host may write
        engine = _sqlite_engine(url, writable)
    else:
        try:
            engine = create_engine(url, pool_pre_ping=True)
        except NoSuchModuleError:
            kind = url.split("://", 1)[0]
            raise DatabaseError(f"{url}: SQLAlchemy knows no database {kind!r} (sqlite, "
                                "postgresql+psycopg, ...)") from None
        except (ArgumentError, ImportError) as exc:
            raise DatabaseError(f"{url}: {exc}") from None
    if writable:  # workers starting together race to create the tables
        _checked(url, lambda: retry_on_race(lambda: Base.metadata.create_all(engine),
                                            attempts=3))
    else:
        _checked(url, lambda: inspect(engine).get_table_names())
    return engine


def _sqlite_engine(url: str, writable: bool) -> Engine:
    path = make_url(url).database
    if path and path != ":memory:":
        file = Path(path)
        if not file.parent.is_dir():
            raise DatabaseError(f"{file}: its directory {file.parent} does not exist")
        if file.is_dir():
            raise DatabaseError(f"{file}: a directory, not a database file")
        if not writable and not file.exists():
            raise DatabaseError(f"no database at {file}")
        if writable and file.exists() and not os.access(file, os.W_OK):
            raise DatabaseError(f"{file}: the database is read-only, and this command "
                                "writes to it; give a writable --db")
        if not writable:  # read an existing file as it is, whatever its permissions
            uri = f"{file.resolve().as_uri()}?mode=ro"
            return create_engine("sqlite://", creator=lambda: sqlite3.connect(
                uri, uri=True, timeout=60, check_same_thread=False))
    engine = create_engine(url, connect_args={"timeout": 60})
    event.listen(engine, "connect", _sqlite_wal)
    return engine


def _checked(url: str, action: Callable[[], object]) -> None:
    """``action()``, with a database that is none (a text file, say) or cannot be reached
    said in a sentence instead of a driver's traceback."""
    try:
        action()
    except SqlDatabaseError as exc:
        reason = str(exc.orig) if getattr(exc, "orig", None) is not None else str(exc)
        raise DatabaseError(f"{url}: {reason}") from None


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
