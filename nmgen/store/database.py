"""Opening the tuned database: SQLite by default (``NMGEN_DB`` or
``~/.cache/nmgen/tuned.db``), any SQLAlchemy URL with ``--db``; the database shipped with
nmgen is read after the user's.

The shipped database is package data, often installed where its reader cannot write (a
system-wide or container install): it is kept in SQLite's rollback-journal mode and read
read-only and immutable, so that a read needs neither a lock nor a ``-shm`` file beside it.
A writable open of it (a maintainer merging records into it) keeps that mode, where every
other SQLite database is switched to write-ahead logging."""

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

T = TypeVar("T")
SHIPPED_DB = Path(__file__).resolve().parent.parent / "tuned_db" / "tuned.sqlite"


def shipped_db() -> Path:
    """The tuned results shipped with nmgen (package data, ``nmgen/tuned_db/``)."""
    return SHIPPED_DB


class DatabaseError(ValueError):
    """A database nmgen cannot use; the message says which and why."""


NMGEN_TABLES = frozenset(Base.metadata.tables)


# Optuna's tables: its RDB storage may share nmgen's database (a server's, by default).
OPTUNA_TABLES = frozenset({
    "alembic_version", "studies", "study_directions", "study_system_attributes",
    "study_user_attributes", "trial_heartbeats", "trial_intermediate_values", "trial_params",
    "trial_system_attributes", "trial_user_attributes", "trial_values", "trials",
    "version_info"})


def default_url() -> str:
    """``NMGEN_DB`` (a URL or a path), else ``~/.cache/nmgen/tuned.db``. An ``NMGEN_DB``
    path in a folder that does not exist is refused: ignored, it would hide the user's
    records (or lose a tune's) without a word."""
    text = os.environ.get("NMGEN_DB")
    if text:
        url = database_url(text)
        file = sqlite_file(url)
        if file is not None and not file.parent.is_dir():
            raise DatabaseError(f"NMGEN_DB={text}: its directory {file.parent} does not "
                                "exist (make it, or point NMGEN_DB elsewhere)")
        return url
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


def sqlite_file(url: str) -> Path | None:
    """The file of an SQLite ``url``; ``None`` for another database."""
    if not url.startswith("sqlite"):
        return None
    path = make_url(url).database
    return Path(path) if path and path != ":memory:" else None


def _refuse_in_memory(url: str) -> None:
    if url.startswith("sqlite") and sqlite_file(url) is None:
        raise DatabaseError(f"{url}: an in-memory database starts empty and ends with the "
                            "process: give a file (sqlite:///PATH, or a path) or a server URL")


def connect(url: str | None = None, writable: bool = True, adopt: bool = False) -> Engine:
    """An engine on the database at ``url`` (default: ``default_url()``), its tables made
    where missing. ``writable=False`` opens an existing database to read (a SQLite file
    read-only) and makes nothing. A database holding tables of another program and none of
    nmgen's is refused (to read, and to write unless ``adopt``: nmgen's tables would be
    added to it), and so is an in-memory one (nothing in it would outlive the process)."""
    url = database_url(url) if url else default_url()
    if writable:
        check_writable(url, adopt)
    engine = _engine(url, writable)
    if writable:  # workers starting together race to create the tables
        _checked(url, lambda: retry_on_race(lambda: Base.metadata.create_all(engine),
                                            attempts=3))
    else:
        _check_readable(url, _tables(url, engine))
    return engine


def check_writable(url: str, adopt: bool = False) -> None:
    """Refuse, before any work and without making or changing anything, what ``connect``
    would refuse to write: an in-memory database, a SQLite file in a missing folder or
    read-only, a file that is no database, and another program's database (unless
    ``adopt``)."""
    url = database_url(url)
    _refuse_in_memory(url)
    file = sqlite_file(url)
    if file is not None:
        _check_sqlite_path(file, writable=True)
        if not file.exists():
            return
        engine = _read_only_engine(file)  # looking changes nothing (no WAL switch)
    else:
        engine = _engine(url, writable=True)
    try:
        tables = _tables(url, engine)
    finally:
        engine.dispose()
    foreign = sorted(tables - NMGEN_TABLES - OPTUNA_TABLES)
    if foreign and not tables & NMGEN_TABLES and not adopt:
        raise DatabaseError(f"{url}: holds another program's tables ({_names(foreign)}) and "
                            "none of nmgen's: give a database of nmgen's or an empty one, or "
                            "--force-db to add nmgen's tables to this one")


def _check_readable(url: str, tables: set[str]) -> None:
    if tables & NMGEN_TABLES:
        return
    if not tables:
        raise DatabaseError(f"{url}: an empty database, no nmgen records in it "
                            "(nmgen tune --db makes them)")
    raise DatabaseError(f"{url}: not an nmgen database (it holds {_names(sorted(tables))}, "
                        "none of nmgen's tables)")


def _names(tables: list[str]) -> str:
    return ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")


def _tables(url: str, engine: Engine) -> set[str]:
    return _checked(url, lambda: set(inspect(engine).get_table_names()))


def _engine(url: str, writable: bool) -> Engine:
    _refuse_in_memory(url)
    if url.startswith("sqlite"):  # several worker processes of one host may write
        return _sqlite_engine(url, writable)
    try:
        return create_engine(url, pool_pre_ping=True)
    except NoSuchModuleError:
        kind = url.split("://", 1)[0]
        raise DatabaseError(f"{url}: SQLAlchemy knows no database {kind!r} (sqlite, "
                            "postgresql+psycopg, ...)") from None
    except (ArgumentError, ImportError) as exc:
        raise DatabaseError(f"{url}: {exc}") from None


def _check_sqlite_path(file: Path, writable: bool) -> None:
    if not file.parent.is_dir():
        raise DatabaseError(f"{file}: its directory {file.parent} does not exist")
    if file.is_dir():
        raise DatabaseError(f"{file}: a directory, not a database file")
    if not writable and not file.exists():
        raise DatabaseError(f"no database at {file}")
    if writable and file.exists() and not os.access(file, os.W_OK):
        raise DatabaseError(f"{file}: the database is read-only, and this command "
                            "writes to it; give a writable --db")


def _sqlite_engine(url: str, writable: bool) -> Engine:
    file = sqlite_file(url)
    _check_sqlite_path(file, writable)
    if not writable:
        return _read_only_engine(file)
    engine = create_engine(url, connect_args={"timeout": 60})
    event.listen(engine, "connect", _sqlite_rollback if is_shipped(file) else _sqlite_wal)
    return engine


def is_shipped(file: Path) -> bool:
    """Whether ``file`` is the database shipped with nmgen (by its resolved path)."""
    try:
        return file.resolve() == SHIPPED_DB.resolve()
    except OSError:
        return False


def _read_only_engine(file: Path) -> Engine:
    """An engine reading an existing SQLite file as it is, whatever its permissions. The
    shipped database is opened immutable too: SQLite then takes no lock and makes no
    ``-shm`` or ``-journal`` file, which a reader of a read-only install could not."""
    flags = "mode=ro&immutable=1" if is_shipped(file) else "mode=ro"
    uri = f"{file.resolve().as_uri()}?{flags}"
    return create_engine("sqlite://", creator=lambda: sqlite3.connect(
        uri, uri=True, timeout=60, check_same_thread=False))


def _checked(url: str, action: Callable[[], T]) -> T:
    """``action()``, with a database that is none (a text file, say) or cannot be reached
    said in a sentence instead of a driver's traceback."""
    try:
        return action()
    except SqlDatabaseError as exc:
        reason = str(exc.orig) if getattr(exc, "orig", None) is not None else str(exc)
        raise DatabaseError(f"{url}: {reason}") from None


RACE_ERRORS = (IntegrityError, OperationalError, ProgrammingError)


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


def _sqlite_rollback(dbapi_connection, _record) -> None:
    """The shipped database stays in rollback-journal mode (see the module docstring):
    a merge into it must not switch it to write-ahead logging."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=DELETE")
    cursor.close()
