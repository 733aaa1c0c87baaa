"""The ``nmgen`` command line: tune, show, export."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from .config import ALayout, ConfigError
from .format import Pattern
from .shapes import ShapeFileError, read_shapes


def _patterns(text: str) -> list[Pattern]:
    return [Pattern.parse(p) for p in text.split(",") if p.strip()]


def _tasks(args: argparse.Namespace):
    from .model import gpu_spec
    from .tuner import TuneTask

    spec = gpu_spec(args.gpu)
    shapes = read_shapes(args.shapes)
    return [TuneTask(spec, p.n, p.m, args.vec, ALayout(args.layout), *shape)
            for p in _patterns(args.pattern) for shape in shapes]


def _tune(args: argparse.Namespace) -> int:
    tasks = _tasks(args)
    if args.dry_run:
        from .tuner import dry_run

        for i, task in enumerate(tasks, 1):
            print(f"[{i}/{len(tasks)}] {task.study_name}", flush=True)
            for rank, row in enumerate(dry_run(task, top=min(args.trials, 4)), 1):
                extra = (f" regs={row['registers']} spills={row['spills']}"
                         if "registers" in row else "")
                print(f"  {rank}. {row['config']}  model {row['model_ms']:.4f} ms{extra}")
        return 0
    from .db import connect, default_url
    from .gpu.launch import device_info
    from .model import check_device
    from .tuner import Tuner

    info = device_info()
    check_device(tasks[0].gpu, info.name, info.sms, info.major, info.minor)
    url = args.db or default_url()
    tuner = Tuner(connect(url), args.storage or url, trials=args.trials)
    start, done = time.monotonic(), 0
    for i, task in enumerate(tasks, 1):
        left = args.time_budget - (time.monotonic() - start)
        if left <= 0:
            print(f"time budget spent after {i - 1} of {len(tasks)} problems", file=sys.stderr)
            break
        print(f"[{i}/{len(tasks)}] {task.study_name}", file=sys.stderr, flush=True)
        tuner.tune(task, time_budget_s=left / (len(tasks) - i + 1))
        done += 1
    tuner.close()
    print(f"tuned {done} of {len(tasks)} problems in {time.monotonic() - start:.1f} s "
          f"into {url}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from .db import connect, summary

    rows = summary(connect(args.db))
    print(f"{'gpu':8} {'pattern':8} {'L':>4} {'A':3} {'M':>6} {'N':>6} {'K':>6} {'trials':>6} "
          f"{'ms':>9} {'TFLOP/s':>8} {'model ms':>9}  best")
    for r in sorted(rows, key=lambda r: (r["gpu"], r["pattern"], r["shape"])):
        m, n, k = r["shape"]
        ms = f"{r['time_ms']:.4f}" if r["time_ms"] else "-"
        tf = f"{r['tflops']:.1f}" if r["tflops"] else "-"
        model = f"{r['model_ms']:.4f}" if r["model_ms"] else "-"
        print(f"{r['gpu']:8} {r['pattern']:8} {r['vec']:>4} {r['a_layout']:3} {m:>6} {n:>6} "
              f"{k:>6} {r['trials']:>6} {ms:>9} {tf:>8} {model:>9}  {r['best'] or '-'}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .export import export_from_db, export_kernel, load_config

    if args.from_db:
        if not args.shapes:
            raise ValueError("export --from-db needs --shapes FILE")
        index = export_from_db(args.db, read_shapes(args.shapes), args.out, args.cubin)
        print(index)
        return 0
    if not args.config:
        raise ValueError("export needs --config NAME|FILE.json or --from-db --shapes FILE")
    for spec in args.config:
        for path in export_kernel(load_config(spec), args.out, cubin=args.cubin):
            print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nmgen", description="N:M sparse GEMM kernel "
                                     "compiler and autotuner")
    sub = parser.add_subparsers(dest="command", required=True)

    tune = sub.add_parser("tune", help="tune kernels for a GPU and a list of shapes")
    tune.add_argument("--gpu", required=True, help="GPU table entry, e.g. h100")
    tune.add_argument("--shapes", type=Path, required=True, help="file of 'M N K' lines")
    tune.add_argument("--pattern", default="16:32,12:32,8:32,4:32")
    tune.add_argument("--vec", type=int, default=32, help="vector length L")
    tune.add_argument("--layout", choices=[a.value for a in ALayout], default="rm",
                      help="A layout: rm (row-major M×K) or km (K-major)")
    tune.add_argument("--trials", type=int, default=40, help="trials per problem")
    tune.add_argument("--time-budget", type=float, default=math.inf, help="seconds in all")
    tune.add_argument("--db", help="SQLAlchemy URL of the tuned database")
    tune.add_argument("--storage", help="Optuna storage URL (default: the --db URL)")
    tune.add_argument("--dry-run", action="store_true",
                      help="rank by the model and compile the top configurations; no GPU")
    tune.set_defaults(run=_tune)

    show = sub.add_parser("show", help="table of tuned results")
    show.add_argument("--db", help="SQLAlchemy URL of the tuned database")
    show.set_defaults(run=_show)

    export = sub.add_parser("export", help="write generated .cu files for inspection")
    export.add_argument("--config", action="append",
                        help="kernel name or configuration JSON file (repeatable)")
    export.add_argument("--from-db", action="store_true",
                        help="export the tuned winners of --shapes from --db")
    export.add_argument("--shapes", type=Path, help="with --from-db: the shapes")
    export.add_argument("--db", help="SQLAlchemy URL of the tuned database")
    export.add_argument("--out", type=Path, required=True, help="output directory")
    export.add_argument("--cubin", action="store_true",
                        help="also compile with nvcc: .cubin and the ptxas resource report")
    export.set_defaults(run=_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ConfigError, ShapeFileError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"nmgen {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
