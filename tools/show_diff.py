"""Two `nmgen show` tables, before and after: over the problems both hold, the tuned
time's change per pattern and layout (geometric mean of before / after, its range) and
the winners that changed. The after table may hold a part of the problems (one new tune).

    git show REV:results/tuned_db/show.txt.gz > /tmp/before.txt.gz
    nmgen show > /tmp/after.txt
    python tools/show_diff.py /tmp/before.txt.gz /tmp/after.txt

(either table plain or gzip-compressed, as ``results/tuned_db/show.txt.gz`` is kept).
"""

from __future__ import annotations

import argparse
import gzip
import math
from collections import defaultdict
from pathlib import Path

KEY = ("gpu", "family", "dtype", "pattern", "L", "A", "M", "N", "K")


def read_show(path: Path) -> dict[tuple[str, ...], tuple[float, str]]:
    """(gpu, family, dtype, pattern, L, A, M, N, K) -> (tuned ms, winner) of each measured
    row of an `nmgen show` table (columns found by the header; a table of before the
    family and dtype columns reads as family f32, dtype f32)."""
    raw = path.read_bytes()
    lines = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode().splitlines()
    header = lines[0].replace("model ms", "model_ms").split()
    rows = {}
    for line in lines[1:]:
        cells = dict(zip(header, line.split(), strict=False))
        if cells.get("ms", "-") == "-":
            continue
        key = tuple(cells.get(k, "f32") for k in KEY)
        rows[key] = (float(cells["ms"]), cells["best"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    before, after = read_show(args.before), read_show(args.after)
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    changed = defaultdict(int)
    for key, (ms, winner) in before.items():
        if key not in after:
            continue
        new_ms, new_winner = after[key]
        ratios[(key[3], key[5])].append(ms / new_ms)
        changed[(key[3], key[5])] += winner != new_winner
    print("| pattern | A | problems | before / after time (geomean) | min | max | "
          "winners changed |\n| --- | --- | --- | --- | --- | --- | --- |")
    for (pattern, layout), values in sorted(ratios.items()):
        geomean = math.exp(sum(map(math.log, values)) / len(values))
        print(f"| {pattern} | {layout} | {len(values)} | {geomean:.4f} | {min(values):.3f} | "
              f"{max(values):.3f} | {changed[(pattern, layout)]} |")


if __name__ == "__main__":
    main()
