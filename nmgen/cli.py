"""The ``nmgen`` command line: tune, show, export."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from .config import ALayout, ConfigError
from .format import Pattern
from .shapes import ShapeFileError, read_shapes


def _process_age() -> float:
    """Seconds since this process started (Linux: /proc), imports included."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return math.nan


def _patterns(text: str) -> list[Pattern]:
    return [Pattern.parse(p) for p in text.split(",") if p.strip()]


def _tasks(args: argparse.Namespace):
    from .model import gpu_spec
    from .tuner import TuneTask

    spec = gpu_spec(args.gpu)
    shapes = read_shapes(args.shapes)
    return [TuneTask(spec, p.n, p.m, args.vec, ALayout(args.layout), *shape)
            for p in _patterns(args.pattern) for shape in shapes]


def _devices(text: str | None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each worker that ``--devices`` asks for: its
    indices count the GPUs this process sees, so under ``CUDA_VISIBLE_DEVICES=2,3``,
    ``0,1`` and ``all`` both mean GPUs 2 and 3."""
    if not text:
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = None if env is None else [d.strip() for d in env.split(",") if d.strip()]
    if text == "all":
        if visible is None:
            from .gpu.launch import device_count

            visible = [str(i) for i in range(device_count())]
        if not visible:
            raise RuntimeError("--devices all: no CUDA GPU found"
                               + (f" (CUDA_VISIBLE_DEVICES={env!r})" if env is not None else ""))
        return visible
    wanted = [d.strip() for d in text.split(",") if d.strip()]
    twice = sorted({d for d in wanted if wanted.count(d) > 1})
    if twice:
        raise ValueError(f"--devices {text}: GPU {','.join(twice)} named twice (one worker a GPU)")
    if visible is None:
        return wanted
    bad = [d for d in wanted if not (d.isdigit() and int(d) < len(visible))]
    if bad:
        raise ValueError(f"--devices {','.join(bad)}: not an index of the {len(visible)} GPUs "
                         f"that CUDA_VISIBLE_DEVICES={env} leaves visible")
    return [visible[int(d)] for d in wanted]


def _tune(args: argparse.Namespace) -> int:
    from .db import default_url
    from .studies import check_storage, default_storage_url

    for option, value, least in (("--compile-workers", args.compile_workers, 1),
                                 ("--ahead-workers", args.ahead_workers, 0),
                                 ("--in-flight", args.in_flight, 1)):
        if value is not None and value < least:
            raise ValueError(f"{option} must be at least {least}, not {value}")
    tasks = _tasks(args)
    devices = _devices(args.devices)
    workers = max(len(devices), args.worker_count)
    db_url = args.db or default_url()
    storage_url = args.storage or default_storage_url(db_url)
    check_storage(storage_url, workers)
    if devices:
        return _supervise(args, devices, db_url, storage_url)
    return _work(args, tasks, db_url, storage_url)


def _supervise(args: argparse.Namespace, devices: list[str], db_url: str,
               storage_url: str) -> int:
    from .db import connect
    from .studies import open_storage
    from .workers import supervise

    connect(db_url)  # tables and storage made once, before the workers race to make them
    open_storage(storage_url)

    def child_argv(index: int, _device: str) -> list[str]:
        argv = ["tune", "--gpu", args.gpu, "--shapes", str(args.shapes), "--pattern",
                args.pattern, "--vec", str(args.vec), "--layout", args.layout, "--trials",
                str(args.trials), "--db", db_url, "--storage", storage_url,
                "--worker-index", str(index), "--worker-count", str(len(devices)),
                "--compile-top", str(args.compile_top)]
        if math.isfinite(args.time_budget):
            argv += ["--time-budget", str(args.time_budget)]
        for option, value in (("--compile-workers", args.compile_workers),
                              ("--ahead-workers", args.ahead_workers),
                              ("--in-flight", args.in_flight)):
            argv += [option, str(value)] if value is not None else []
        return argv + (["--dry-run"] if args.dry_run else [])

    start = time.monotonic()
    code = supervise(child_argv, devices, storage_url,
                     lambda s: print(f"nmgen tune: {s}", file=sys.stderr, flush=True))
    print(f"{len(devices)} workers finished in {time.monotonic() - start:.1f} s "
          f"(storage {storage_url}, results in {db_url})")
    return code


def _work(args: argparse.Namespace, tasks: list, db_url: str, storage_url: str) -> int:
    from .db import connect
    from .studies import open_storage
    from .tuner import Tuner, default_ahead_workers
    from .workers import run_worker

    if not args.dry_run:
        from .gpu.launch import device_info
        from .model import check_device

        info = device_info()
        check_device(tasks[0].gpu, info.name, info.sms, info.major, info.minor)
    prefix = f"[worker {args.worker_index}] " if args.worker_count > 1 else ""
    workers = Tuner.workers if args.compile_workers is None else args.compile_workers
    ahead = default_ahead_workers(workers) if args.ahead_workers is None else args.ahead_workers
    tuner = Tuner(connect(db_url), open_storage(storage_url), trials=args.trials,
                  dry_run=args.dry_run, seed=args.worker_index, workers=workers,
                  ahead_workers=0 if args.dry_run else ahead,
                  in_flight=args.in_flight or Tuner.in_flight,
                  log=lambda s: print(prefix + s, file=sys.stderr, flush=True))
    if not args.dry_run:
        tuner.log(f"set up {_process_age():.1f} s after the process started; compile "
                  f"processes: {workers} for the batches timed next, {ahead} for the next "
                  f"studies' seeds; {tuner.in_flight} studies at once")
    try:
        report = run_worker(tuner, tasks, args.time_budget, args.worker_index,
                            args.worker_count, log=tuner.log)
    finally:
        closing = time.monotonic()
        tuner.close()
    print(f"{prefix}worked on {report.studies} problems; {report.complete} of "
          f"{report.total} complete; {report.seconds:.1f} s ({report.phases}); "
          f"compile processes closed in {time.monotonic() - closing:.1f} s; "
          f"results in {db_url}")
    if (summary := tuner.compile_summary()) is not None:
        print(prefix + summary)
    if args.dry_run and args.compile_top > 0:
        _print_dry_run(tuner, tasks, args.compile_top)
    return 0


def _print_dry_run(tuner, tasks: list, top: int) -> None:
    """The model's best configurations of each problem, compiled with nvcc."""
    from .db import TrialStatus, trials_of
    from .tuner import ModelMeasurer, compile_report

    for i, task in enumerate(tasks, 1):
        print(f"[{i}/{len(tasks)}] {tuner.study_name(task)}", flush=True)
        rows = [r for r in trials_of(tuner.engine, ModelMeasurer(task).key)
                if r.status == TrialStatus.MODEL]
        rows.sort(key=lambda r: (r.time_ms, r.config_row.name))
        best = rows[:top]
        compiled = compile_report([r.config_row.config for r in best])
        for rank, (row, res) in enumerate(zip(best, compiled, strict=True), 1):
            print(f"  {rank}. {res['config']}  model {row.time_ms:.4f} ms "
                  f"regs={res['registers']} spills={res['spills']}")


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


def _carry(args: argparse.Namespace) -> int:
    import tempfile

    from .carry import carry, tree_of_revision
    from .db import connect

    with tempfile.TemporaryDirectory() as tmp:
        root = args.tree or tree_of_revision(args.repo, args.from_rev, Path(tmp) / "old")
        url = _scratch_copy(args.db, Path(tmp)) if args.plan else args.db
        engine = connect(url)
        patterns = {(p.n, p.m) for p in _patterns(args.pattern)} if args.pattern else None
        report = carry(engine, root, top=args.remeasure, patterns=patterns)
        print(report, flush=True)
        if args.plan:
            _print_plan(report, args.remeasure)
        elif report.remeasure:
            _remeasure(engine, report.remeasure, args.dry_run)
        if args.remeasure > 0:
            lacking = {key: core for key, core in _lacking_core(engine, patterns).items()
                       if core[0] not in report.remeasure.get(key, [])}
            _time_core(engine, lacking, args.dry_run, args.plan)
    return 0


def _core_times(args: argparse.Namespace) -> int:
    from .db import connect

    patterns = {(p.n, p.m) for p in _patterns(args.pattern)} if args.pattern else None
    engine = connect(args.db)
    _time_core(engine, _lacking_core(engine, patterns), args.dry_run, args.plan)
    return 0


def _stream_k(args: argparse.Namespace) -> int:
    from .db import connect
    from .refine import stream_k_candidates

    patterns = {(p.n, p.m) for p in _patterns(args.pattern)} if args.pattern else None
    engine = connect(args.db)
    twins = stream_k_candidates(engine, patterns, top=args.top, min_gain=args.min_gain)
    kernels = {c.name: c for configs in twins.values() for c in configs}
    verb = "would be timed" if args.plan else "timed"
    print(f"stream-K twins {verb} on {len(twins)} problems ({len(kernels)} distinct kernels)",
          flush=True)
    if twins and not args.plan:
        if not args.dry_run:  # compile them all at once, not one a problem
            from .gpu.timing import precompile

            for error in precompile(list(kernels.values()), workers=args.workers):
                print(f"compile error: {error}", file=sys.stderr, flush=True)
        _remeasure(engine, twins, args.dry_run)
    return 0


def _time_core(engine, lacking: dict, dry_run: bool, plan: bool) -> None:
    """Time the hand-picked kernel of the problems ``lacking`` it (``plan``: count them)."""
    verb = "would be timed" if plan else "timed"
    print(f"hand-picked kernel {verb} on {len(lacking)} problems whose records lack it",
          flush=True)
    if lacking and not plan:
        _remeasure(engine, lacking, dry_run)


def _lacking_core(engine, patterns: set[tuple[int, int]] | None) -> dict:
    """Problems of the current generator whose records hold no result of their hand-picked
    kernel (``space.core_config``), the reference no tuned shape may fall below: a carry
    drops it where the generator changed it and it was not among a problem's fastest."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from .config import Arch
    from .db import ConfigRow, ProblemKey, ProblemRow, TrialRow
    from .dispatch import template_hash
    from .space import Problem, core_config

    lacking = {}
    with Session(engine) as session:
        held = {(pid, name) for pid, name in session.execute(
            select(TrialRow.problem_id, ConfigRow.name).join(TrialRow.config_row))}
        for row in session.scalars(select(ProblemRow).where(
                ProblemRow.template_hash == template_hash())):
            if patterns is not None and (row.n, row.m) not in patterns:
                continue
            core = core_config(Problem(row.n, row.m, row.vec, ALayout(row.a_layout),
                                       Arch(row.gpu.arch)))
            if core is None or (row.id, core.name) in held:
                continue
            lacking[ProblemKey.of_row(row)] = [core]
    return lacking


def _print_plan(report, top: int) -> None:
    """What ``carry --plan`` found: the changed kernels by pattern and the remeasure."""
    from collections import Counter

    from .config import KernelConfig

    patterns = Counter(f"{c.n}:{c.m}" for c in map(KernelConfig.from_name, report.changed))
    print("changed kernels by pattern: " + (", ".join(
        f"{p} {count}" for p, count in sorted(patterns.items())) or "none"))
    kernels = [c for configs in report.remeasure.values() for c in configs]
    print(f"--remeasure {top} would time {len(kernels)} kernels "
          f"({len({c.name for c in kernels})} distinct) of {len(report.remeasure)} "
          "problems; nothing was written")


def _scratch_copy(url: str | None, folder: Path) -> str:
    """A copy of the SQLite database at ``url`` in ``folder`` (``carry --plan``)."""
    import sqlite3

    from .db import default_url

    url = url or default_url()
    if not url.startswith("sqlite:///"):
        raise ValueError(f"carry --plan works on an SQLite file, not {url}")
    copy = folder / "plan.sqlite"
    # SQLite's backup, not a file copy: it includes what the write-ahead log still holds.
    with sqlite3.connect(url.removeprefix("sqlite:///")) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    return f"sqlite:///{copy}"


def _is_present(spec) -> bool:
    """Whether the GPU present is the table entry ``spec``."""
    from .gpu.launch import device_info
    from .model import check_device

    info = device_info()
    try:
        check_device(spec, info.name, info.sms, info.major, info.minor)
    except ValueError:
        return False
    return True


def _remeasure(engine, problems: dict, dry_run: bool) -> None:
    """Time again, on this GPU, each problem's changed finalists (``carry --remeasure``);
    problems of another GPU or CUDA version are left for a machine that has them."""
    from .model import gpu_spec
    from .tuner import GpuMeasurer, ModelMeasurer, Tuner, TuneTask

    tuner = Tuner(engine, storage=None, dry_run=dry_run,
                  log=lambda s: print(s, file=sys.stderr, flush=True))
    skipped = 0
    try:
        for i, (key, configs) in enumerate(problems.items(), 1):
            task = TuneTask(gpu_spec(key.gpu), key.n, key.m, key.vec, ALayout(key.a_layout),
                            key.rows, key.cols, key.depth)
            if not (dry_run or _is_present(task.gpu)):
                skipped += 1
                continue
            here = ModelMeasurer(task).key if dry_run else GpuMeasurer.key_of(task)
            if here.same_family() != key.same_family():
                skipped += 1
                continue
            winner = tuner.remeasure(task, configs)
            best = f"{winner.time_ms:.4f} ms {winner.config.name}" if winner else "none"
            print(f"[{i}/{len(problems)}] {task.study_name}: {len(configs)} remeasured, "
                  f"best {best}", flush=True)
    finally:
        tuner.close()
    if skipped:
        print(f"{skipped} problems of another GPU or CUDA version were not remeasured here")


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


def _bench(args: argparse.Namespace) -> int:
    from .db import connect, default_url, record_ceilings, shipped_db
    from .dispatch import Dispatcher
    from .gpu.bench import run_bench
    from .gpu.launch import device_info
    from .model import gpu_of_device_name
    from .results import summary_table, write_all, write_csv

    info = device_info()
    shapes = read_shapes(args.shapes)
    shipped = [f"sqlite:///{shipped_db()}"] if shipped_db().exists() else []
    dispatcher = Dispatcher([args.db, *shipped] if args.db else None)  # yours, then shipped
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "bench.partial.csv"  # rows so far: a cut run still leaves them
    rows, ceilings = run_bench(shapes, _patterns(args.pattern), args.vec, dispatcher,
                               repeat=args.repeat, layout=ALayout(args.layout),
                               on_row=lambda rows: write_csv(rows, partial))
    partial.unlink(missing_ok=True)
    gpu = gpu_of_device_name(info.name) or info.name
    record_ceilings(connect(args.db or default_url()), gpu, info.name,
                    ceilings.fp32_tflops, ceilings.dram_gbs)
    meta = {"device": info.name, "gpu": gpu, "cuda_runtime": info.cuda_version,
            "a_layout": args.layout,
            "command": "nmgen " + " ".join(sys.argv[1:]), "seconds":
            round(time.monotonic() - start, 1), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                    time.gmtime())}
    ceil = {"fp32_tflops": ceilings.fp32_tflops, "dram_gbs": ceilings.dram_gbs}
    paths = write_all(rows, args.out, ceil, meta)
    print(summary_table(rows))
    if not args.no_plots:
        paths += _draw(rows, ceil, args.out, info.name)
    print("\n".join(str(p) for p in paths))
    wrong = sum(not r.correct for r in rows)
    if wrong:
        print(f"nmgen bench: {wrong} results differ from the float64 reference",
              file=sys.stderr)
    return 1 if wrong else 0


def _draw(rows, ceilings: dict, out: Path, device: str) -> list[Path]:
    from .plots import all_plots

    return all_plots(rows, ceilings, out, device)


def _plot(args: argparse.Namespace) -> int:
    import json

    from .results import markdown_report, read_csv

    rows = read_csv(args.dir / "bench.csv")
    record = json.loads((args.dir / "bench.json").read_text())
    (args.dir / "bench.md").write_text(markdown_report(rows))
    print(args.dir / "bench.md")
    for path in _draw(rows, record["ceilings"], args.dir, record.get("device", "")):
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
    tune.add_argument("--storage", help="Optuna storage: an SQLAlchemy URL or journal:PATH "
                      "(default: a journal file beside a SQLite --db, else the --db URL)")
    tune.add_argument("--dry-run", action="store_true",
                      help="search with the model as the measure (recorded as status "
                      "'model') and compile the top configurations; no GPU")
    tune.add_argument("--compile-top", type=int, default=4,
                      help="dry run: compile this many best configurations a problem")
    tune.add_argument("--devices", help="GPUs to tune on, one worker each: 0,1,... or all")
    tune.add_argument("--compile-workers", type=int, default=None, metavar="N",
                      help="compile processes a worker gives the batch it times next "
                      "(default 8)")
    tune.add_argument("--ahead-workers", type=int, default=None, metavar="N",
                      help="compile processes a worker gives the next studies' seeds "
                      "(default: the host's spare cores, at most --compile-workers)")
    tune.add_argument("--in-flight", type=int, default=None, metavar="N",
                      help="studies a worker keeps going at once, measuring one while "
                      "another's batch compiles (default 8)")
    tune.add_argument("--worker-index", type=int, default=0,
                      help="this worker's number when several share the studies")
    tune.add_argument("--worker-count", type=int, default=1,
                      help="how many workers share the studies (spreads their start)")
    tune.set_defaults(run=_tune)

    show = sub.add_parser("show", help="table of tuned results")
    show.add_argument("--db", help="SQLAlchemy URL of the tuned database")
    show.set_defaults(run=_show)

    carry = sub.add_parser("carry", help="keep the tuned records of kernels that a newer "
                           "template or code generator renders unchanged")
    made_by = carry.add_mutually_exclusive_group(required=True)
    made_by.add_argument("--from-rev", help="git revision whose generator made the records")
    made_by.add_argument("--tree", type=Path, help="... or its source tree (nmgen/, templates/)")
    carry.add_argument("--repo", type=Path, default=Path("."), help="git repository of --from-rev")
    carry.add_argument("--db", help="SQLAlchemy URL of the tuned database")
    carry.add_argument("--remeasure", type=int, default=0, metavar="TOP",
                       help="then time again, on this GPU, the changed kernels among each "
                            "problem's TOP fastest (0: drop them, tune again later)")
    carry.add_argument("--pattern", help="carry only these patterns' problems (16:32,8:32); "
                       "a later carry from the same tree takes the rest")
    carry.add_argument("--dry-run", action="store_true",
                       help="--remeasure with the model's estimates (no GPU)")
    carry.add_argument("--plan", action="store_true",
                       help="say what would be carried, dropped and remeasured, on a copy "
                            "of the SQLite database (nothing written)")
    carry.set_defaults(run=_carry)

    core = sub.add_parser("core-times", help="time the hand-picked kernel on every tuned "
                          "problem whose records lack it (carry --remeasure does this too)")
    core.add_argument("--db", help="SQLAlchemy URL of the tuned database")
    core.add_argument("--pattern", help="only these patterns' problems (16:32,8:32)")
    core.add_argument("--dry-run", action="store_true", help="the model's estimates (no GPU)")
    core.add_argument("--plan", action="store_true", help="only count the problems")
    core.set_defaults(run=_core_times)

    stream = sub.add_parser("stream-k", help="time the stream-K twins of tuned problems' "
                            "fastest kernels where the model expects them faster")
    stream.add_argument("--db", help="SQLAlchemy URL of the tuned database")
    stream.add_argument("--pattern", help="only these patterns' problems (16:32,8:32)")
    stream.add_argument("--top", type=int, default=1,
                        help="twins of each problem's TOP fastest kernels (default 1)")
    stream.add_argument("--min-gain", type=float, default=0.05,
                        help="the model's expected gain a twin needs (default 0.05)")
    stream.add_argument("--workers", type=int, default=16, help="compile processes")
    stream.add_argument("--dry-run", action="store_true", help="the model's estimates (no GPU)")
    stream.add_argument("--plan", action="store_true", help="only count the problems")
    stream.set_defaults(run=_stream_k)

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

    bench = sub.add_parser("bench", help="nmgen (through dispatch) against cuBLAS, with "
                           "tables and plots")
    bench.add_argument("--shapes", type=Path, required=True, help="file of 'M N K' lines")
    bench.add_argument("--pattern", default="16:32,12:32,8:32,4:32")
    bench.add_argument("--vec", type=int, default=32, help="vector length L")
    bench.add_argument("--layout", choices=[a.value for a in ALayout], default="rm",
                       help="A layout: rm (row-major M×K) or km (K-major)")
    bench.add_argument("--db", help="your tuned database (default: yours, then shipped)")
    bench.add_argument("--repeat", type=int, default=20, help="timed runs (median)")
    bench.add_argument("--out", type=Path, default=Path("bench_out"), help="output directory")
    bench.add_argument("--no-plots", action="store_true", help="tables only")
    bench.set_defaults(run=_bench)

    plot = sub.add_parser("plot", help="redraw the tables and plots of a recorded bench "
                          "output")
    plot.add_argument("dir", type=Path, help="an nmgen bench --out directory")
    plot.set_defaults(run=_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ConfigError, ShapeFileError, ValueError, FileNotFoundError, RuntimeError
            ) as exc:
        print(f"nmgen {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
