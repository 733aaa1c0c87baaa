"""Do the bench and the tuning run agree? For every row of a bench CSV: the time the
tuning run stored for the same kernel on the same problem (and for the hand-picked core
kernel), against the bench's own timing of it. Reads the tuned database; no GPU.

    python tools/bench_vs_tune.py results/bench_h100/bench.csv [--db sqlite:///tuned_db/tuned.sqlite]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.db import ConfigRow, GpuRow, ProblemRow, TrialRow, TrialStatus, connect  # noqa: E402
from nmgen.results import read_csv  # noqa: E402

PACKAGE_DB = Path(__file__).resolve().parent.parent / "tuned_db" / "tuned.sqlite"


def tuned_times(engine, gpu: str) -> dict[tuple, float]:
    """(n, m, vec, M, N, K, kernel name) -> stored time, for ``gpu``'s correct trials."""
    stmt = (select(ProblemRow.n, ProblemRow.m, ProblemRow.vec, ProblemRow.rows,
                   ProblemRow.cols, ProblemRow.depth, ConfigRow.name, TrialRow.time_ms)
            .join(TrialRow.problem).join(ProblemRow.gpu).join(TrialRow.config_row)
            .where(GpuRow.name == gpu, TrialRow.status == TrialStatus.OK))
    with Session(engine) as session:
        return {tuple(r[:7]): r[7] for r in session.execute(stmt)}


def core_verdicts(rows, stored: dict[tuple, float]) -> str:
    """Where the bench found the hand-picked kernel faster than the tuned one: what the
    tuning run had stored for the two."""
    faster = [r for r in rows if r.core_ms and r.core_ms < r.nmgen_ms]
    both, tuning_agreed = 0, 0
    for row in faster:
        n, m = (int(x) for x in row.pattern.split(":"))
        problem = (n, m, row.vec, row.M, row.N, row.K)
        tuned, core = stored.get((*problem, row.config)), stored.get((*problem, row.core_config))
        if tuned and core:
            both += 1
            tuning_agreed += core < tuned
    same = [r for r in faster if r.config == r.core_config]  # one kernel, timed twice
    others = [r.core_ms / r.nmgen_ms for r in faster if r.config != r.core_config]
    worst = f", the slowest at {min(others):.4f} of the hand-picked speed" if others else ""
    return (f"hand-picked faster than tuned in the bench: {len(faster)} rows ({len(same)} of "
            f"them the same kernel timed twice{worst}); both timed in tuning on {both}, where "
            f"tuning too had the hand-picked faster on {tuning_agreed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--db", default=f"sqlite:///{PACKAGE_DB}")
    parser.add_argument("--worst", type=int, default=10, help="rows listed")
    args = parser.parse_args()
    gpu = json.loads((args.csv.parent / "bench.json").read_text())["gpu"]
    stored = tuned_times(connect(args.db), gpu)
    pairs = []  # (bench / tuning time, which, bench row)
    for row in read_csv(args.csv):
        n, m = (int(x) for x in row.pattern.split(":"))
        for which, name, bench_ms in (("tuned", row.config, row.nmgen_ms),
                                      ("core", row.core_config, row.core_ms)):
            tuned_ms = stored.get((n, m, row.vec, row.M, row.N, row.K, name))
            if tuned_ms and bench_ms:
                pairs.append((bench_ms / tuned_ms, which, row))
    if not pairs:
        sys.exit(f"no bench row has a stored trial for {gpu} in {args.db}")
    for which in ("tuned", "core"):
        ratios = sorted((r, row.nmgen_ms if which == "tuned" else row.core_ms)
                        for r, w, row in pairs if w == which)
        if ratios:
            far = [ms for r, ms in ratios if r > 1.10]
            print(f"{which:5}: {len(ratios)} rows, bench/tuning time median "
                  f"{statistics.median(r for r, _ in ratios):.3f}, min {ratios[0][0]:.3f}, "
                  f"max {ratios[-1][0]:.3f}, > 1.10 on {len(far)} "
                  f"({sum(ms < 0.25 for ms in far)} of them under 0.25 ms in the bench)")
    print(core_verdicts(read_csv(args.csv), stored))
    print(f"\nworst {args.worst} (bench/tuning, which, pattern, M N K, bench ms, kernel):")
    for ratio, which, row in sorted(pairs, key=lambda p: -p[0])[:args.worst]:
        name = row.config if which == "tuned" else row.core_config
        print(f"{ratio:6.3f} {which:5} {row.pattern:5} {row.M:>5} {row.N:>6} {row.K:>6} "
              f"{row.nmgen_ms if which == 'tuned' else row.core_ms:8.4f}  {name}")


if __name__ == "__main__":
    main()
