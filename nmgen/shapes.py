"""Shape lists: one ``M N K`` a line, ``#`` comments; errors name the line."""

from __future__ import annotations

import math
from pathlib import Path

Shape = tuple[int, int, int]


class ShapeFileError(ValueError):
    pass


def read_shapes(path: str | Path) -> list[tuple[int, int, int]]:
    shapes = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.replace(",", " ").split()
        try:
            values = tuple(int(f) for f in fields)
        except ValueError:
            raise ShapeFileError(f"{path}:{number}: expected three integers 'M N K', "
                                 f"got {raw.strip()!r}") from None
        if len(values) != 3 or min(values) < 1:
            raise ShapeFileError(f"{path}:{number}: expected three positive integers "
                                 f"'M N K', got {raw.strip()!r}")
        shapes.append(values)
    if not shapes:
        raise ShapeFileError(f"{path}: no shapes")
    return shapes


def shape_distance(s1: Shape, s2: Shape) -> float:
    """How far apart two problems are for a kernel's choice: summed |log| ratios of M, N, K."""
    return sum(abs(math.log(max(x, 1) / max(y, 1))) for x, y in zip(s1, s2, strict=True))
