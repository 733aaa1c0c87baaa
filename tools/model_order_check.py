"""How well the analytic model orders the kernels a tuned database measured: for every
problem of the current generator on one GPU, the model's estimates of its measured
kernels against their times. Reports the share of pairs it orders as measured (pairs
within 3 % of each other left out as noise) and the regret of its pick (measured time of
the kernel it ranks first over the fastest measured), overall and by pattern and layout.
``--floor``/``--full-warps`` evaluate other values of the occupancy curve
(``model.occupancy_efficiency``) on the same records.

    python tools/model_order_check.py [--db sqlite:///tuned_db/tuned.sqlite] [--gpu h100]
    python tools/model_order_check.py --floor 0.5 --full-warps 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.bench.report import markdown_table  # noqa: E402
from nmgen.families.f32_simt import F32_SIMT, model  # noqa: E402
from nmgen.families.f32_simt.config import KernelConfig  # noqa: E402
from nmgen.gpus import gpu_spec  # noqa: E402
from nmgen.store.database import connect  # noqa: E402
from nmgen.store.tables import ProblemRow, TrialRow, TrialStatus  # noqa: E402

NOISE = 1.03  # measured pairs closer than this are not counted


def measured(session: Session, problem: ProblemRow) -> list[tuple[KernelConfig, float]]:
    rows = session.scalars(select(TrialRow).where(TrialRow.problem_id == problem.id,
                                                  TrialRow.status == TrialStatus.OK))
    return [(KernelConfig.from_name(t.config_row.name), t.time_ms) for t in rows
            if t.time_ms is not None]


def order_stats(times: np.ndarray, predicted: np.ndarray) -> tuple[int, int, float]:
    """(concordant pairs, counted pairs, regret of the model's pick)."""
    ratio = times[:, None] / times[None, :]
    counted = ratio > NOISE  # i measured slower than j by more than the noise
    concordant = counted & (predicted[:, None] > predicted[None, :])
    return int(concordant.sum()), int(counted.sum()), float(times[np.argmin(predicted)]
                                                            / times.min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite:///tuned_db/tuned.sqlite")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--floor", type=float, default=model.OCCUPANCY_FLOOR)
    parser.add_argument("--full-warps", type=float, default=model.FULL_OCCUPANCY_WARPS)
    args = parser.parse_args()
    model.OCCUPANCY_FLOOR, model.FULL_OCCUPANCY_WARPS = args.floor, args.full_warps
    model._fixed.cache_clear()
    gpu = gpu_spec(args.gpu)
    groups: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    with Session(connect(args.db)) as session:
        for problem in session.scalars(select(ProblemRow).where(
                ProblemRow.template_hash == F32_SIMT.generator_hash())):
            if problem.gpu.name != args.gpu:
                continue
            trials = measured(session, problem)
            if len(trials) < 2:
                continue
            table = model.RankTable([c for c, _ in trials], gpu)
            known = {c.name: t for c, t in trials}
            times = np.array([known[c.name] for c in table.configs])
            predicted = table.predicted_ms(problem.rows, problem.cols, problem.depth)
            stats = order_stats(times, predicted)
            groups[f"{problem.n}:{problem.m} L={problem.vec} {problem.a_layout}"].append(stats)
    print(f"# Model order against {args.db} ({args.gpu}): occupancy floor {args.floor}, "
          f"full at {args.full_warps} warps\n")
    everything = [s for stats in groups.values() for s in stats]
    rows = []
    for label, stats in [*sorted(groups.items()), ("all", everything)]:
        concordant, counted = sum(s[0] for s in stats), sum(s[1] for s in stats)
        regrets = [s[2] for s in stats]
        rows.append([f"{label} ({len(stats)})", f"{concordant / max(counted, 1):.3f} of {counted}",
                     f"{statistics.median(regrets):.3f} / {max(regrets):.3f}"])
    print(markdown_table(["problems", "pairs ordered as measured",
                          "pick's regret (median / max)"], rows), end="")

if __name__ == "__main__":
    main()
