"""bench.md again from a bench.csv: the same tables ``nmgen bench`` writes, for a run
made before a table was added (the CSV holds every measured figure).

    python tools/bench_report.py results/bench_h100/bench.csv > results/bench_h100/bench.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.results import markdown_report, read_csv  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    sys.stdout.write(markdown_report(read_csv(parser.parse_args().csv)))


if __name__ == "__main__":
    main()
