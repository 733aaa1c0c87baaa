"""Sliced K against the tuned winners, in one process: for every (pattern, shape) the
kernel that dispatch runs today (the tuned database's winner), the same kernel with
slice_k 2 and 4, and the model's best sliced configurations; each checked against
float64 (NaN-poisoned output), then all timed in turns.

    python tools/slice_ab.py --shapes shapes/small_m.txt --pattern 16:32,8:32 \
        --layout km --out results/slice_ab_h100
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _ab import precompile  # noqa: E402

from nmgen.codegen import render  # noqa: E402
from nmgen.config import ALayout, KernelConfig  # noqa: E402
from nmgen.model import feasible, gpu_of_device_name, gpu_spec, rank  # noqa: E402
from nmgen.report import geomean, markdown_table  # noqa: E402
from nmgen.shapes import read_shapes  # noqa: E402
from nmgen.space import enumerate_configs, try_config  # noqa: E402
from nmgen.tuner import TuneTask, params_of  # noqa: E402

MODEL_PICKS = 3  # the model's best sliced configurations tried beside the winner's slices


def candidates(task: TuneTask, winner: KernelConfig) -> list[KernelConfig]:
    """The winner, its sliced variants, and the model's best sliced configurations."""
    picks = [winner]
    for slices in (2, 4):
        params = {**params_of(winner), "slice_k": slices}
        params["ks"] = params.pop("ks_windows") * task.m
        warp_m, warp_n = (int(x) for x in params.pop("warp").split("x"))
        sliced = try_config(task.problem, **params, warp_m=warp_m, warp_n=warp_n)
        if sliced is not None and feasible(sliced, task.gpu) is None:
            picks.append(sliced)
    sliced_space = [c for c in enumerate_configs(task.problem) if c.slice_k > 1
                    and (task.a_layout is ALayout.K_MAJOR or c.a_tile == winner.a_tile)]
    ranked = rank(sliced_space, task.gpu, task.rows, task.cols, task.depth)
    picks += [c for _, c in ranked[:MODEL_PICKS]]
    return list(dict.fromkeys(picks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=Path, required=True)
    parser.add_argument("--pattern", default="16:32,12:32,8:32,4:32")
    parser.add_argument("--layout", choices=["rm", "km"], default="km")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

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
    for pattern in args.pattern.split(","):
        n, m = (int(x) for x in pattern.split(":"))
        for rows, cols, depth in read_shapes(args.shapes):
            task = TuneTask(gpu, n, m, 32, layout, rows, cols, depth)
            decision = dispatcher.decide(problem_key(n, m, 32, layout, rows, cols, depth))
            jobs.append((task, decision.source, candidates(task, decision.config)))
    precompile([render(c) for _, _, picks in jobs for c in picks])
    rows_out, record = [], []
    for task, source, picks in jobs:
        bench = ProblemBench(task.n, task.m, 32, layout, task.rows, task.cols, task.depth)
        kernels = {c.name: Kernel(c) for c in picks}
        errors = {name: bench.error(k) for name, k in kernels.items()}
        ms = time_in_turns({name: bench.launcher(k) for name, k in kernels.items()
                            if errors[name] < RTOL}, rounds=args.rounds)
        winner = picks[0].name
        sliced = {name: t for name, t in ms.items() if name != winner}
        best = min(sliced, key=sliced.get) if sliced else None
        shape = f"{task.rows}x{task.cols}x{task.depth}"
        rows_out.append([f"{task.n}:{task.m}", shape, source, f"{ms.get(winner, float('nan')):.4f}",
                         f"{sliced[best]:.4f}" if best else "-",
                         f"{ms[winner] / sliced[best]:.3f}" if best and winner in ms else "-",
                         f"`{best}`" if best else "-",
                         f"{max(errors.values()):.1e}"])
        record.append({"pattern": f"{task.n}:{task.m}", "shape": [task.rows, task.cols, task.depth],
                       "dispatch": source, "winner": winner, "ms": ms, "errors": errors})
        print(" | ".join(rows_out[-1]), file=sys.stderr, flush=True)
        del bench
    speedups = [r["ms"][r["winner"]] / min(t for n, t in r["ms"].items() if n != r["winner"])
                for r in record if len(r["ms"]) > 1 and r["winner"] in r["ms"]]
    table = markdown_table(["pattern", "shape", "winner from", "winner ms", "best sliced ms",
                            "winner / sliced", "best sliced kernel", "max rel. error"], rows_out)
    text = (f"{info.name}, L=32, A {layout.value}; {args.rounds} rounds in turns; winner / "
            f"best sliced, geomean {geomean(speedups):.3f} over {len(speedups)} problems\n\n"
            f"{table}")
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"slice_ab_{layout.value}.md").write_text(text + "\n")
        (args.out / f"slice_ab_{layout.value}.json").write_text(
            json.dumps({"gpu": info.name, "layout": layout.value, "rows": record}, indent=1) + "\n")


if __name__ == "__main__":
    main()
