"""Sliced K against the tuned winners, in one process: for every (pattern, shape) the
kernel that dispatch runs today (the tuned database's winner), the same kernel with
slice_k 2 and 4, and the model's best sliced configurations; each checked against
float64 (NaN-poisoned output), then all timed in turns.

    python tools/slice_ab.py --shapes results/slice_ab_h100/shapes.txt \
        --pattern 16:32,12:32,8:32,4:32 --layout km --out results/slice_ab_h100
    python tools/slice_ab.py --report-only --layout km --out results/slice_ab_h100  # host
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _ab import precompile  # noqa: E402

from nmgen.codegen import render  # noqa: E402
from nmgen.config import ALayout, ConfigError, KernelConfig  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.model import (  # noqa: E402
    blocks_per_sm,
    estimate,
    feasible,
    gpu_of_device_name,
    gpu_spec,
    rank,
)
from nmgen.report import geomean, markdown_table  # noqa: E402
from nmgen.shapes import read_shapes  # noqa: E402
from nmgen.space import enumerate_configs  # noqa: E402
from nmgen.tuner import TuneTask  # noqa: E402

MODEL_PICKS = 3  # the model's best sliced configurations tried beside the winner's slices


def candidates(task: TuneTask, winner: KernelConfig) -> list[KernelConfig]:
    """The winner, its sliced variants, and the model's best sliced configurations."""
    picks = [winner]
    for slices in (2, 4):
        try:
            sliced = winner.replace(slice_k=slices)
        except ConfigError:  # rows a stage not divisible, or too many threads or registers
            continue
        if feasible(sliced, task.gpu) is None:
            picks.append(sliced)
    sliced_space = [c for c in enumerate_configs(task.problem) if c.slice_k > 1
                    and (task.a_layout is ALayout.K_MAJOR or c.a_tile == winner.a_tile)]
    ranked = rank(sliced_space, task.gpu, task.rows, task.cols, task.depth)
    picks += [c for _, c in ranked[:MODEL_PICKS]]
    return list(dict.fromkeys(picks))


def measure(args: argparse.Namespace) -> dict:
    """Every problem's candidates checked and timed on this GPU: the run's record."""
    from nmgen.dispatch import Dispatcher, problem_key
    from nmgen.gpu.launch import Kernel, device_info
    from nmgen.gpu.measure import ProblemBench
    from nmgen.gpu.timing import time_in_turns
    from nmgen.results import RTOL

    info = device_info()
    gpu = gpu_spec(gpu_of_device_name(info.name) or "h100")
    layout = ALayout(args.layout)
    dispatcher = Dispatcher()
    jobs = []
    for pattern in map(Pattern.parse, args.pattern.split(",")):
        for shape in read_shapes(args.shapes):
            task = TuneTask(gpu, pattern.n, pattern.m, 32, layout, *shape)
            decision = dispatcher.decide(problem_key(pattern.n, pattern.m, 32, layout, *shape))
            jobs.append((task, decision.source, candidates(task, decision.config)))
    precompile([render(c) for _, _, picks in jobs for c in picks])
    rows = []
    for task, source, picks in jobs:
        bench = ProblemBench(task.n, task.m, 32, layout, task.rows, task.cols, task.depth)
        kernels = {c.name: Kernel(c) for c in picks}
        errors = {name: bench.error(k) for name, k in kernels.items()}
        ms = time_in_turns({name: bench.launcher(k) for name, k in kernels.items()
                            if errors[name] < RTOL}, rounds=args.rounds)
        rows.append({"pattern": f"{task.n}:{task.m}", "shape": [task.rows, task.cols, task.depth],
                     "dispatch": source, "winner": picks[0].name, "ms": ms, "errors": errors})
        print(f"{rows[-1]['pattern']} {task.rows}x{task.cols}x{task.depth}: {ms}",
              file=sys.stderr, flush=True)
        del bench
    return {"gpu": info.name, "layout": layout.value, "rounds": args.rounds, "rows": rows}


def best_sliced(row: dict) -> tuple[str, float] | None:
    """The fastest correct kernel other than the winner, with its time."""
    sliced = {name: t for name, t in row["ms"].items() if name != row["winner"]}
    return min(sliced.items(), key=lambda item: item[1]) if sliced else None


def report(record: dict) -> str:
    """The run as Markdown: winner over best sliced time by pattern and M, the best of both
    at each M, how the model times lone single-stage sliced kernels, then every problem."""
    gpu = gpu_spec(gpu_of_device_name(record["gpu"]) or "h100")
    ratios: dict[tuple[str, int], list[float]] = defaultdict(list)
    lone, rows_out = [], []
    pairs = agree = first = 0
    for row in record["rows"]:
        winner, best = row["winner"], best_sliced(row)
        m_rows, n_cols, depth = row["shape"]
        if best and winner in row["ms"]:
            ratios[(row["pattern"], m_rows)].append(row["ms"][winner] / best[1])
        model = {name: estimate(KernelConfig.from_name(name), gpu, m_rows, n_cols, depth).time_ms
                 for name in row["ms"]}
        for name, ms in row["ms"].items():
            config = KernelConfig.from_name(name)
            if config.slice_k > 1 and config.stages == 1 and blocks_per_sm(config, gpu) == 1:
                lone.append(model[name] / ms)
        for a, b in itertools.combinations(row["ms"], 2):
            pairs += 1
            agree += (row["ms"][a] < row["ms"][b]) == (model[a] < model[b])
        first += min(model, key=model.get) == min(row["ms"], key=row["ms"].get)
        rows_out.append([row["pattern"], f"{m_rows}x{n_cols}x{depth}", row["dispatch"],
                         f"{row['ms'].get(winner, float('nan')):.4f}",
                         f"{best[1]:.4f}" if best else "-",
                         f"{row['ms'][winner] / best[1]:.3f}" if best and winner in row["ms"]
                         else "-", f"`{best[0]}`" if best else "-",
                         f"{max(row['errors'].values()):.1e}"])
    patterns = list(dict.fromkeys(p for p, _ in ratios))
    ms_list = sorted({m for _, m in ratios})
    by_m = markdown_table(["pattern", *(f"M = {m}" for m in ms_list)], [
        [p, *(f"{geomean(ratios[(p, m)]):.3f} ({min(ratios[(p, m)]):.3f}–"
              f"{max(ratios[(p, m)]):.3f})" if ratios[(p, m)] else "-" for m in ms_list)]
        for p in patterns])
    either = {m: geomean([max(1.0, r) for (_, mm), rs in ratios.items() if mm == m for r in rs])
              for m in ms_list}
    every = [r for rs in ratios.values() for r in rs]
    rounds = f"; {record['rounds']} rounds in turns" if "rounds" in record else ""
    text = (f"{record['gpu']}, L=32, A {record['layout']}{rounds}. Winner time over the best "
            f"sliced kernel's (above 1: sliced is faster), geomean {geomean(every):.3f} over "
            f"{len(every)} problems.\n\n## By pattern and M: geomean (lowest–highest)\n\n{by_m}"
            "\nThe faster of winner and best sliced kernel, over the winner (geomean of all "
            "patterns): " + ", ".join(f"M = {m}: {v:.3f}" for m, v in either.items()) + "\n")
    text += (f"\nThe analytic model as it is now (`nmgen.model.estimate`) orders {agree} of the "
             f"{pairs} pairs of a problem's timed kernels as measured; its first choice is the "
             f"measured best in {first} of {len(record['rows'])} problems.")
    if lone:
        text += (f" Single-stage sliced kernels alone on their SM ({len(lone)} timings): its "
                 f"time over the measured, {min(lone):.2f} to {max(lone):.2f}.")
    text += "\n"
    table = markdown_table(["pattern", "shape", "winner from", "winner ms", "best sliced ms",
                            "winner / sliced", "best sliced kernel", "max rel. error"], rows_out)
    return text + f"\n## Every problem\n\n{table}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=Path)
    parser.add_argument("--pattern", default="16:32,12:32,8:32,4:32")
    parser.add_argument("--layout", choices=["rm", "km"], default="km")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report-only", action="store_true",
                        help="redraw slice_ab_LAYOUT.md from the run's JSON in --out (no GPU)")
    args = parser.parse_args()
    stem = f"slice_ab_{args.layout}"
    if args.report_only:
        record = json.loads((args.out / f"{stem}.json").read_text())
    else:
        if args.shapes is None:
            parser.error("--shapes is needed to measure")
        record = measure(args)
    text = report(record)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{stem}.md").write_text(text)
        if not args.report_only:
            (args.out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
