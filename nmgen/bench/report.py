"""Result tables for people: Markdown from rows of cells (benchmarks, tuning summaries)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ..format import DType

CSV_DTYPE = {DType.F32: "fp32", DType.BF16: "bf16", DType.F16: "fp16"}  # the CSVs' dtype column


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))
