"""How well the model orders the row-major A tiles, read off a tuned database: for every
row-major problem that measured both, the best ``tm`` kernel (A transposed in the inner
loop's reads) over the best ``tx`` kernel (A copied K-major first), measured and as the
current model predicts them, by pattern and M (problems of the current generator). Where
the model calls ``tm`` faster but the GPU does not, a study without tuned neighbours
starts from the wrong seeds (results/scale_h200x2/README.md, run 13 on).

    python tools/model_tiles_check.py [--db sqlite:///tuned_db/tuned.sqlite] [--gpu h100]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from nmgen.config import ATile, KernelConfig
from nmgen.db import GOOD, ProblemRow, TrialRow, connect
from nmgen.dispatch import template_hash
from nmgen.model import estimate, gpu_spec

TILES = (ATile.M_MAJOR.value, ATile.K_MAJOR_COPY.value)  # "tm", "tx"


def best_per_tile(session: Session, problem: ProblemRow) -> dict[str, tuple[float, float]]:
    """tile -> (measured ms, the model's ms now) of the problem's fastest correct kernel
    of that tile."""
    best: dict[str, tuple[float, KernelConfig]] = {}
    for trial in session.scalars(select(TrialRow).where(TrialRow.problem_id == problem.id)):
        if trial.status not in GOOD or trial.time_ms is None:
            continue
        config = KernelConfig.from_name(trial.config_row.name)
        tile = config.a_tile.value
        if tile in TILES and (tile not in best or trial.time_ms < best[tile][0]):
            best[tile] = (trial.time_ms, config)
    gpu = gpu_spec(problem.gpu.name)
    shape = (problem.rows, problem.cols, problem.depth)
    return {tile: (ms, estimate(config, gpu, *shape).time_ms)
            for tile, (ms, config) in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite:///tuned_db/tuned.sqlite")
    parser.add_argument("--gpu", default="h100")
    args = parser.parse_args()
    ratios: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    with Session(connect(args.db)) as session:
        problems = session.scalars(select(ProblemRow).where(
            ProblemRow.a_layout == "rm", ProblemRow.template_hash == template_hash()))
        for problem in problems:
            if problem.gpu.name != args.gpu:
                continue
            best = best_per_tile(session, problem)
            if len(best) == len(TILES):
                (tm_ms, tm_model), (tx_ms, tx_model) = best["tm"], best["tx"]
                ratios[(f"{problem.n}:{problem.m}", problem.rows)].append(
                    (tm_ms / tx_ms, tm_model / tx_model))
    print(f"# Best tm kernel over best tx kernel, row-major A, {args.gpu} ({args.db})\n")
    print("| pattern | M | problems | measured tm/tx (median) | model tm/tx (median) "
          "| tm measured faster | model says tm faster |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (pattern, rows), pairs in sorted(ratios.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        measured = [m for m, _ in pairs]
        model = [p for _, p in pairs]
        print(f"| {pattern} | {rows} | {len(pairs)} | {statistics.median(measured):.3f} | "
              f"{statistics.median(model):.3f} | {sum(m < 1 for m in measured)} | "
              f"{sum(p < 1 for p in model)} |")
    everything = [pair for pairs in ratios.values() for pair in pairs]
    print(f"\nAll {len(everything)} problems: tm measured faster in "
          f"{sum(m < 1 for m, _ in everything)}, the model says tm faster in "
          f"{sum(p < 1 for _, p in everything)}.")


if __name__ == "__main__":
    main()
