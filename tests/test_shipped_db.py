"""The shipped database (``nmgen/tuned_db/tuned.sqlite``) is readable from a read-only
install by a user who cannot write it: kept in rollback-journal mode, opened read-only and
immutable, never switched to write-ahead logging by a writable open."""

from __future__ import annotations

import pwd
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nmgen.store import database

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "nmgen" / "tuned_db" / "tuned.sqlite"
DOC = (ROOT / "docs" / "bad-input.md").read_text()


def journal_bytes(path: Path) -> tuple[int, int]:
    """Bytes 18 and 19 of an SQLite header: 1, 1 in rollback-journal mode, 2, 2 in WAL."""
    header = path.read_bytes()[:100]
    assert header.startswith(b"SQLite format 3\0"), path
    return header[18], header[19]


def test_the_committed_database_is_in_rollback_journal_mode():
    assert journal_bytes(SHIPPED) == (1, 1)
    assert "| the shipped database read from a read-only install by another user |" in DOC


def test_a_writable_open_of_the_shipped_database_keeps_it_in_rollback_mode(tmp_path,
                                                                          monkeypatch):
    copy = tmp_path / "tuned.sqlite"
    shutil.copy(SHIPPED, copy)
    monkeypatch.setattr(database, "SHIPPED_DB", copy)
    engine = database.connect(str(copy))
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE scratch (x INTEGER)")
        conn.exec_driver_sql("DROP TABLE scratch")
    engine.dispose()
    assert journal_bytes(copy) == (1, 1)
    assert not list(tmp_path.glob("tuned.sqlite-*"))  # no -wal or -shm left beside it


def test_another_writable_database_still_gets_write_ahead_logging(tmp_path):
    path = tmp_path / "mine.db"
    database.connect(str(path)).dispose()
    assert journal_bytes(path) == (2, 2)


def test_a_read_only_open_of_the_shipped_database_is_immutable(monkeypatch):
    opened = []
    real = sqlite3.connect
    monkeypatch.setattr(database.sqlite3, "connect",
                        lambda name, **kw: opened.append(name) or real(name, **kw))
    database.connect(f"sqlite:///{SHIPPED}", writable=False)
    assert opened and opened[0].endswith("?mode=ro&immutable=1")


READER = """
import os, sys
site, copy, uid, gid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, site)
import nmgen
from nmgen.policy import summary
from nmgen.store.database import connect, shipped_db
assert nmgen.__file__.startswith(site), nmgen.__file__
summary(connect(f"sqlite:///{copy}", writable=False))  # every lazy import, as root
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
assert not os.access(shipped_db(), os.W_OK) and not os.access(shipped_db().parent, os.W_OK)
rows = summary(connect(f"sqlite:///{shipped_db()}", writable=False))
print(os.geteuid(), len(rows))
"""


def _install(target: Path) -> Path:
    """nmgen installed (its package data included) into ``target``/site, read-only."""
    source = target / "src"
    shutil.copytree(ROOT / "nmgen", source / "nmgen",
                    ignore=shutil.ignore_patterns("__pycache__", "*.sqlite-*"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    site = target / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-build-isolation", "--no-index", "--target", str(site),
                           str(source)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"pip cannot install here: {done.stderr.strip()[-300:]}")
    for path in [site, *site.rglob("*")]:
        mode = path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        path.chmod(mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
                   | (0o111 if path.is_dir() else 0))
    return site


def test_a_read_only_install_reads_the_shipped_database_as_another_user():
    """Installed into a read-only folder and read by ``nobody`` (the test drops root's
    privileges after the imports: root's own home, where Python lives, is closed to
    ``nobody``); as a user other than root, by that user."""
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' to read as")
    target = Path(tempfile.mkdtemp(prefix="nmgen-ro-"))
    try:
        target.chmod(0o755)
        site = _install(target)
        copy = target / "copy.sqlite"
        shutil.copy(SHIPPED, copy)
        done = subprocess.run([sys.executable, "-I", "-c", READER, str(site), str(copy),
                               str(nobody.pw_uid), str(nobody.pw_gid)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        uid, rows = (int(x) for x in done.stdout.split())
        assert uid != 0 and rows > 0
        assert sorted(p.name for p in (site / "nmgen" / "tuned_db").iterdir()) == \
            ["tuned.sqlite"]
    finally:
        for path in [target, *target.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | stat.S_IWUSR)
        shutil.rmtree(target)
