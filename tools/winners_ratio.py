"""Winner times of two `nmgen show` tables, shape by shape: the second run's over the first's.

    python tools/winners_ratio.py FIRST_SHOW SECOND_SHOW LABEL
    e.g. python tools/winners_ratio.py one_show.txt all_show.txt all/one
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from show_diff import read_show  # noqa: E402

from nmgen.bench.report import geomean  # noqa: E402


def winners(path: str) -> dict[tuple[str, ...], float]:
    """(problem) -> winner ms, from an `nmgen show` table."""
    return {key: ms for key, (ms, _) in read_show(Path(path)).items()}


def main() -> None:
    first_path, second_path, label = sys.argv[1:4]
    first, second = winners(first_path), winners(second_path)
    ratios = [second[s] / first[s] for s in first if s in second]
    print(f"winners {label} over {len(ratios)} of {len(first)} shapes: "
          + (f"geomean {geomean(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}"
             if ratios else "none in both"))


if __name__ == "__main__":
    main()
