"""Row-major over K-major A: the geometric mean of nmgen's time ratio by pattern and M,
from two ``nmgen bench`` CSVs of the same shapes (``--layout rm`` and ``--layout km``).

    python tools/layout_ratio.py results/bench_h100/bench.csv results/bench_km_h100/bench.csv
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.report import geomean, markdown_table  # noqa: E402
from nmgen.results import read_csv  # noqa: E402


def times(path: Path) -> dict[tuple[str, int, int, int], float]:
    return {(r.pattern, r.M, r.N, r.K): r.nmgen_ms for r in read_csv(path)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row_major", type=Path)
    parser.add_argument("k_major", type=Path)
    args = parser.parse_args()
    rm, km = times(args.row_major), times(args.k_major)
    ratios: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key in rm.keys() & km.keys():
        ratios[key[0]][key[1]].append(rm[key] / km[key])
    ms = sorted({m for by_m in ratios.values() for m in by_m})
    rows = [[p, *(f"{geomean(ratios[p][m]):.3f}" for m in ms),
             f"{geomean([r for rs in ratios[p].values() for r in rs]):.3f}"]
            for p in sorted(ratios, key=lambda p: -int(p.split(':')[0]))]
    print(f"row-major / K-major nmgen time, geomean over the shapes of both files "
          f"({len(rm.keys() & km.keys())})\n")
    print(markdown_table(["pattern", *(f"M = {m}" for m in ms), "all"], rows))


if __name__ == "__main__":
    main()
