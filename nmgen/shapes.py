"""Shape lists: one ``M N K`` a line, ``#`` comments; errors name the file and the line."""

from __future__ import annotations

import math
from pathlib import Path

Shape = tuple[int, int, int]
# The kernels index rows, columns and depth with 32-bit integers.
MAX_DIM = 2**31 - 1


class ShapeFileError(ValueError):
    pass


def read_shapes(path: str | Path) -> list[tuple[int, int, int]]:
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is no text
    except UnicodeDecodeError as exc:
        raise ShapeFileError(f"{path}: not a UTF-8 text file ({exc.reason} at byte "
                             f"{exc.start})") from None
    except IsADirectoryError:
        raise ShapeFileError(f"{path}: a directory, not a shapes file") from None
    shapes = []
    for number, raw in enumerate(text.splitlines(), start=1):
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
        if max(values) > MAX_DIM:
            raise ShapeFileError(f"{path}:{number}: {raw.strip()!r}: each of M, N and K "
                                 f"must be at most {MAX_DIM} (32-bit indexing)")
        shapes.append(values)
    if not shapes:
        raise ShapeFileError(f"{path}: no shapes")
    return shapes


def shape_distance(s1: Shape, s2: Shape) -> float:
    """How far apart two problems are for a kernel's choice: summed |log| ratios of M, N, K."""
    return sum(abs(math.log(max(x, 1) / max(y, 1))) for x, y in zip(s1, s2, strict=True))
