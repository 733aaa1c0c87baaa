"""How well each family's analytic model orders the kernels a tuned database measured, for
every problem of the families' current generators on one GPU:

- within a problem: the share of its measured kernels' pairs the model orders as measured
  (pairs within 3 % of each other left out as noise) and the regret of its pick (measured
  time of the kernel it ranks first over the fastest measured);
- across problems: Spearman's rank correlation of the winners' model estimates with their
  measured times (does the model know which shapes are slow).

A slimmed database (the shipped one keeps each problem's four fastest trials and its
reference kernel) shows only the top of each search. ``--floor``/``--full-warps`` evaluate
other values of the FP32 family's occupancy curve on the same records.

    python tools/model_order_check.py [--db sqlite:///nmgen/tuned_db/tuned.sqlite] [--gpu h100]
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
from nmgen.families.f32_simt import model as f32_model  # noqa: E402
from nmgen.families.registry import all_families  # noqa: E402
from nmgen.gpus import gpu_spec  # noqa: E402
from nmgen.store.database import connect  # noqa: E402
from nmgen.store.tables import ProblemRow, TrialRow, TrialStatus  # noqa: E402

NOISE = 1.03  # measured pairs closer than this are not counted


def order_stats(times: np.ndarray, predicted: np.ndarray) -> tuple[int, int, float]:
    """(concordant pairs, counted pairs, regret of the model's pick)."""
    ratio = times[:, None] / times[None, :]
    counted = ratio > NOISE  # i measured slower than j by more than the noise
    concordant = counted & (predicted[:, None] > predicted[None, :])
    return int(concordant.sum()), int(counted.sum()), float(times[np.argmin(predicted)]
                                                            / times.min())


def spearman(x: list[float], y: list[float]) -> float:
    rank = lambda v: np.argsort(np.argsort(v)).astype(float)  # noqa: E731 (no ties here)
    return float(np.corrcoef(rank(x), rank(y))[0, 1]) if len(x) > 2 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite:///nmgen/tuned_db/tuned.sqlite")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--floor", type=float, default=f32_model.OCCUPANCY_FLOOR)
    parser.add_argument("--full-warps", type=float, default=f32_model.FULL_OCCUPANCY_WARPS)
    args = parser.parse_args()
    f32_model.OCCUPANCY_FLOOR, f32_model.FULL_OCCUPANCY_WARPS = args.floor, args.full_warps
    f32_model._fixed.cache_clear()
    gpu = gpu_spec(args.gpu)
    families = {f.generator_hash(): f for f in all_families()}
    within: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    winners: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    with Session(connect(args.db, writable=False)) as session:
        for problem in session.scalars(select(ProblemRow)):
            family = families.get(problem.template_hash)
            if family is None or problem.gpu.name != args.gpu:
                continue
            trials = [(family.config_from_name(t.config_row.name), t.time_ms)
                      for t in session.scalars(select(TrialRow).where(
                          TrialRow.problem_id == problem.id, TrialRow.status == TrialStatus.OK))
                      if t.time_ms is not None]
            if len(trials) < 2:
                continue
            shape = (problem.rows, problem.cols, problem.depth)
            times = np.array([t for _, t in trials])
            predicted = np.array([family.estimate_ms(c, gpu, shape) for c, _ in trials])
            label = f"{family.name} {problem.dtype}"
            within[label].append(order_stats(times, predicted))
            best = int(np.argmin(times))
            winners[label][0].append(float(predicted[best]))
            winners[label][1].append(float(times[best]))
    print(f"# Model order against {args.db} ({args.gpu})\n")
    rows = []
    for label in sorted(within):
        stats = within[label]
        concordant, counted = sum(s[0] for s in stats), sum(s[1] for s in stats)
        regrets = [s[2] for s in stats]
        rows.append([f"{label} ({len(stats)})", f"{spearman(*winners[label]):.3f}",
                     f"{concordant / max(counted, 1):.3f} of {counted}",
                     f"{statistics.median(regrets):.3f} / {max(regrets):.3f}"])
    print(markdown_table(["family, dtype (problems)", "winners: rank correlation with time",
                          "pairs ordered as measured", "pick's regret (median / max)"], rows),
          end="")


if __name__ == "__main__":
    main()
