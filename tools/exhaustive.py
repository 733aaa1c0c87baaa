"""The model-seeded search against an exhaustive one (issue 3), in two steps.

measure (GPU): every configuration of the tuner's space (``nmgen.tune.replay.search_space``)
    on each sample shape, measured as the tuner measures (``GpuMeasurer``). One JSON
    line a (shape, configuration); a slice ``i/n`` lets n processes share the space (one
    a GPU), and a re-run skips what a file already holds.

    CUDA_VISIBLE_DEVICES=$i python tools/exhaustive.py measure --slice $i/8 \\
        --pattern 8:32 --layout km --shapes shapes/exhaustive.txt \\
        --out results/exhaustive_h100

    ``--space core`` (the FP32 family's ``CORE_SPACE``, ~900 configurations) in place of the
    tuner's whole space (~20,000 at K-major 8:32, hours of compiling): the search is then
    replayed in that same smaller space.

model (CPU): how the analytic model ranks the measured space (rank correlation, the
    measured best's place in the model's order, its seeds against the best).

replay (CPU): the real tuner, seeded by the model, replayed on those numbers
    (``nmgen.tune.replay``) for several trial budgets and seeds; prints and writes how far its
    winner is from the exhaustive best and what share of the space it tried.

    python tools/exhaustive.py replay --pattern 8:32 --layout km --gpu h100 \\
        --trials 16,32,64,128 --seeds 0-4 --out results/exhaustive_h100
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.bench.report import markdown_table  # noqa: E402
from nmgen.families.f32_simt import F32_SIMT  # noqa: E402
from nmgen.families.f32_simt.space import SUBSPACES, UNSLICED_SPACE  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpus import gpu_spec  # noqa: E402
from nmgen.problem import ALayout  # noqa: E402
from nmgen.shapes import read_shapes  # noqa: E402
from nmgen.tune.replay import read_tables, replay, search_space  # noqa: E402
from nmgen.tune.task import TuneTask  # noqa: E402

# The tuner's spaces, and the whole space without packing and split-K (3,496 configurations
# at K-major 8:32 against 20,664: one device call of ~7 minutes on an H100).
SPACES = {**SUBSPACES, "nopack": UNSLICED_SPACE.narrowed(packing=(False,), split_k=(1,))}
# The tables of the whole space were measured before sliced K joined it: the space they
# cover is now "unsliced", their files keep the name they were written under.
TABLE_NAMES = {"unsliced": "full"}


def tasks_of(args: argparse.Namespace) -> list[TuneTask]:
    p = Pattern.parse(args.pattern)
    return [TuneTask.of(gpu_spec(args.gpu), F32_SIMT, p.n, p.m, args.vec, ALayout(args.layout),
                        shape, space=SPACES[args.space])
            for shape in read_shapes(args.shapes)]


def stem(args: argparse.Namespace) -> str:
    """Output files of one (pattern, layout, space)."""
    space = TABLE_NAMES.get(args.space, args.space)
    return f"{args.pattern.replace(':', '_')}_{args.layout}_{space}"


def measure(args: argparse.Namespace) -> None:
    """The tuner's own measurement (``GpuMeasurer``: compile in the pool, check against
    float64 once, time with CUDA events) of every configuration of the slice."""
    from nmgen.compiler.pool import CompilePool
    from nmgen.tune.measurers import INFEASIBLE_MS, GpuMeasurer

    index, count = (int(x) for x in args.slice.split("/"))
    tasks = tasks_of(args)
    space = search_space(tasks[0])[index::count]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem(args)}_slice{index}of{count}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    done = {(tuple(r["shape"]), r["config"]) for r in map(json.loads, lines)}
    start = time.monotonic()
    log(f"slice {index}/{count}: {len(space)} configurations x {len(tasks)} shapes, "
        f"{len(done)} already measured")
    with CompilePool(args.workers) as pool, path.open("a") as out:
        for task in tasks:
            shape = (task.rows, task.cols, task.depth)
            measurer = GpuMeasurer(task, pool)
            measurer.prepare(space)  # compiled once: the kernel cache serves later shapes
            for i, config in enumerate(space, 1):
                if (shape, config.name) in done:
                    continue
                status, value, error = measurer.measure(config, 0.0)
                out.write(json.dumps({"shape": shape, "config": config.name, "status": status,
                                      "ms": None if value == INFEASIBLE_MS else value,
                                      "error": error}) + "\n")
                weight = measurer._bench.weight  # drop the plan, and with it the module
                for key in [k for k in weight._prepared if k[0] == "plan"]:
                    del weight._prepared[key]
                if i % 500 == 0:
                    out.flush()
                    log(f"{shape}: {i}/{len(space)} ({time.monotonic() - start:.0f} s)")
    log(f"done in {time.monotonic() - start:.0f} s: {path}")


def replay_runs(args: argparse.Namespace) -> None:
    tables = read_tables(sorted(args.out.glob(f"{stem(args)}_slice*.jsonl*")))
    seeds = range(int(args.seeds.split("-")[0]), int(args.seeds.split("-")[-1]) + 1)
    rows, record = [], []
    for trials in (int(t) for t in args.trials.split(",")):
        results = list(replay(tasks_of(args), tables, trials, seeds, device=args.gpu))
        for shape in dict.fromkeys(r.shape for r in results):
            sel = [r for r in results if r.shape == shape]
            gaps = [100 * r.gap for r in sel]
            rows.append([f"{shape[0]}x{shape[1]}x{shape[2]}", trials, sel[0].space,
                         f"{100 * sel[0].trial_share:.2f} %", f"{statistics.median(gaps):.2f} %",
                         f"{max(gaps):.2f} %", f"{sel[0].exhaustive_ms:.4f}"])
            record += [{**vars(r), "gap": r.gap} for r in sel]
    table = markdown_table(["shape", "trials", "space", "share of space",
                            "gap to exhaustive (median)", "worst", "exhaustive best ms"], rows)
    print(table)
    (args.out / f"replay_{stem(args)}.md").write_text(table)
    (args.out / f"replay_{stem(args)}.json").write_text(json.dumps(record, indent=1) + "\n")


def model_check(args: argparse.Namespace) -> None:
    """How the analytic model ranks the measured space (CPU): its rank correlation with
    the measured times, where the measured best stands in its order, and how far the best
    of its first few (the tuner's model seeds) is from the measured best."""
    import numpy as np

    from nmgen.families.f32_simt.model import estimate, rank
    from nmgen.tune.seeds import SEEDS_FROM_MODEL, model_seeds

    tables = read_tables(sorted(args.out.glob(f"{stem(args)}_slice*.jsonl*")))
    rows = []
    for task in tasks_of(args):
        shape = (task.rows, task.cols, task.depth)
        table = tables[shape]
        configs = [c for c in search_space(task)
                   if table[c.name].status == "ok" and table[c.name].ms is not None]
        measured = np.array([table[c.name].ms for c in configs])
        modelled = np.array([estimate(c, task.gpu, *shape).time_ms for c in configs])
        rho = np.corrcoef(np.argsort(np.argsort(measured)),
                          np.argsort(np.argsort(modelled)))[0, 1]
        order = [c.name for _, c in rank(configs, task.gpu, *shape)]
        best = configs[int(np.argmin(measured))].name
        seeds = model_seeds(task, SEEDS_FROM_MODEL)
        seeds_best = min(table[c.name].ms for c in seeds)
        rows.append([f"{shape[0]}x{shape[1]}x{shape[2]}", len(configs), f"{rho:.2f}",
                     order.index(best) + 1, f"{table[order[0]].ms / measured.min():.3f}",
                     f"{seeds_best / measured.min():.3f}"])
    table_md = markdown_table(
        ["shape", "configurations", "Spearman rank correlation, model and measured",
         "measured best's place in the model's order", "model's first / best",
         f"best of the {SEEDS_FROM_MODEL} model seeds / best"], rows)
    print(table_md)
    (args.out / f"model_{stem(args)}.md").write_text(table_md)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("measure", "replay", "model"))
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--pattern", default="8:32")
    parser.add_argument("--vec", type=int, default=32)
    parser.add_argument("--layout", choices=("rm", "km"), default="km")
    parser.add_argument("--space", choices=sorted(SPACES), default="full",
                        help="the whole space or a smaller one")
    parser.add_argument("--shapes", default="shapes/exhaustive.txt", help="a shapes file")
    parser.add_argument("--out", type=Path, default=Path("results/exhaustive_h100"))
    parser.add_argument("--slice", default="0/1", help="i/n: this process's share")
    parser.add_argument("--workers", type=int, default=16, help="compile processes")
    parser.add_argument("--trials", default="16,32,64,128", help="replay: trial budgets")
    parser.add_argument("--seeds", default="0-4", help="replay: sampler seeds, a-b")
    args = parser.parse_args()
    {"measure": measure, "replay": replay_runs, "model": model_check}[args.step](args)


if __name__ == "__main__":
    main()
