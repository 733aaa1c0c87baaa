"""Table writers on given data: the numbers in the table are the ones passed in."""

from __future__ import annotations

import pytest

from nmgen.bench.report import geomean, markdown_table


def test_markdown_table():
    text = markdown_table(["a", "b"], [[1, "x"], [2.5, "`y`"]])
    assert text.splitlines() == ["| a | b |", "| --- | --- |", "| 1 | x |", "| 2.5 | `y` |"]


def test_geomean():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
