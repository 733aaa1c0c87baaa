"""The shape lists under shapes/ parse, and the list of decode shapes nobody tuned holds
no (N, K) pair that a shipped record holds at any M. No GPU."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from nmgen.shapes import read_shapes
from nmgen.store.database import SHIPPED_DB

ROOT = Path(__file__).resolve().parent.parent
LISTS = sorted((ROOT / "shapes").glob("*.txt"))


@pytest.mark.parametrize("path", LISTS, ids=lambda p: p.name)
def test_every_shape_list_parses(path):
    shapes = read_shapes(path)
    assert shapes and all(min(s) >= 1 for s in shapes), path.name


def test_the_untuned_decode_shapes_are_in_no_shipped_record():
    shapes = read_shapes(ROOT / "shapes" / "decode_untuned.txt")
    pairs = {(n, k) for _, n, k in shapes}
    assert {m for m, _, _ in shapes} == {1, 2, 4, 8, 16, 32, 64}
    assert len(pairs) >= 20 and all(1024 <= n <= 65536 and 1024 <= k <= 32768
                                    for n, k in pairs)
    with sqlite3.connect(f"file:{SHIPPED_DB}?mode=ro&immutable=1", uri=True) as db:
        tuned = set(db.execute("SELECT cols, depth FROM nm_problems"))
    assert len(tuned) >= 20, "the shipped database holds its (N, K) pairs"
    assert not pairs & tuned, f"pairs a shipped record holds: {sorted(pairs & tuned)}"
