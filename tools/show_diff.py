"""Two `nmgen show` tables, before and after: over the problems both hold, the tuned
time's change per pattern and layout (geometric mean of before / after, its range) and
the winners that changed. The after table may hold a part of the problems (one new tune).

    git show 2545baa:results/tuned_db_show.txt > /tmp/before.txt
    python tools/show_diff.py /tmp/before.txt results/tuned_db_show.txt
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path


def read_show(path: Path) -> dict[tuple[str, ...], tuple[float, str]]:
    """(gpu, pattern, L, A, M, N, K) -> (tuned ms, winner) of each row of the table."""
    rows = {}
    for line in path.read_text().splitlines()[1:]:
        fields = line.split()
        rows[tuple(fields[:7])] = (float(fields[8]), fields[11])
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
        ratios[(key[1], key[3])].append(ms / new_ms)
        changed[(key[1], key[3])] += winner != new_winner
    print("| pattern | A | problems | before / after time (geomean) | min | max | "
          "winners changed |\n| --- | --- | --- | --- | --- | --- | --- |")
    for (pattern, layout), values in sorted(ratios.items()):
        geomean = math.exp(sum(map(math.log, values)) / len(values))
        print(f"| {pattern} | {layout} | {len(values)} | {geomean:.4f} | {min(values):.3f} | "
              f"{max(values):.3f} | {changed[(pattern, layout)]} |")


if __name__ == "__main__":
    main()
