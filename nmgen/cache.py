"""Results that take seconds to build and depend only on nmgen's own code, kept on disk
between processes (each tuning worker needs them before its first study): the search
space's enumeration and the model's table of it."""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def cache_root() -> Path:
    return Path(os.environ.get("NMGEN_CACHE_DIR") or Path.home() / ".cache" / "nmgen")


def cache_file(kind: str, key: object, sources: Sequence[Path]) -> Path:
    """Where the ``kind`` result for ``key`` is kept: keyed on ``repr(key)``, the Python
    version and the text of the ``sources`` it depends on, so that changing any of them
    starts anew."""
    digest = hashlib.sha256(repr((key, sys.version_info[:2])).encode())
    for source in sources:
        digest.update(Path(source).read_bytes())
    return cache_root() / kind / f"{digest.hexdigest()[:32]}.pickle"


def load_or_build(path: Path, build: Callable[[], T], kind: type) -> T:
    """The ``kind`` object kept at ``path``, else ``build()``, written there for the next
    process (whole or not at all; a read-only cache builds every time)."""
    try:
        value = pickle.loads(path.read_bytes())
        if isinstance(value, kind):
            return value
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, TypeError,
            ImportError, ValueError):
        pass  # none yet, or unreadable: build it again
    value = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        partial.replace(path)  # whichever process writes last
    except OSError:
        pass
    return value
