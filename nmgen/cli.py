"""The ``nmgen`` command line: arguments and printing; the work is done by the modules it
calls (``nmgen.tune``, ``nmgen.bench``, ``nmgen.export``)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from pathlib import Path

from .families.space import ConfigError
from .format import MAX_INDEX, DType, Pattern, check_width
from .problem import ALayout
from .shapes import ShapeFileError, read_shapes
from .version import __version__


def _patterns(text: str) -> list[Pattern]:
    """The patterns of ``--pattern``, each once (a repeat would tune its problems twice)."""
    patterns = list(dict.fromkeys(Pattern.parse(p) for p in text.split(",") if p.strip()))
    if not patterns:
        raise ValueError(f"--pattern {text!r}: no pattern given (e.g. 8:32 or 2:4,8:32)")
    return patterns


def _pattern_set(text: str | None) -> set[tuple[int, int]] | None:
    return {(p.n, p.m) for p in _patterns(text)} if text else None


def _tasks(args: argparse.Namespace) -> list:
    """One task a (pattern, shape, family serving it); a problem that no family's space
    can serve is an error, not a tune that stores nothing."""
    from .families.registry import get, serving
    from .gpus import gpu_spec
    from .problem import Problem
    from .tune.task import TuneTask

    spec = gpu_spec(args.gpu)
    shapes = list(dict.fromkeys(read_shapes(args.shapes)))  # a repeated line tunes once
    for shape in shapes:
        try:
            check_width(args.vec, shape[1])
        except ValueError as exc:
            raise ValueError(f"{args.shapes}: shape {' '.join(map(str, shape))}: {exc}") from None
    tasks = []
    for p in _patterns(args.pattern):
        problem = Problem(p.n, p.m, args.vec, ALayout(args.layout), spec.arch,
                          DType.parse(args.dtype))
        families = [get(args.family)] if args.family else serving(problem)
        if not families:
            raise ValueError(f"no kernel family serves {problem}")
        # Without --family, each family only where it can win (Family.tunes).
        pairs = [(f, s) for f in families for s in shapes if args.family or f.tunes(s)]
        for family in dict.fromkeys(f for f, _ in pairs):
            if family.serves(problem) is not None:
                raise ValueError(f"--family {family.name}: {family.serves(problem)}")
            _check_space(args, family, problem)
        tasks += [TuneTask(spec, f, problem, *shape) for f, shape in pairs]
    return tasks


def _check_space(args: argparse.Namespace, family, problem) -> None:
    """Refuse a problem no configuration of ``family``'s space fits, and ``--trials``
    beyond the configurations there are (a study could never have them). The first call
    builds the family's enumeration (cached on disk for the workers)."""
    from .families.space import parallel_enumeration

    with parallel_enumeration(os.cpu_count() or 1):
        size = len(family.seed_candidates(problem, family.space))
    if not size:
        raise ValueError(f"no {family.name} kernel fits {problem}: no configuration "
                         f"of its space is valid for L = {args.vec}")
    if getattr(args, "trials_given", False) and args.trials > size:
        raise ValueError(f"--trials {args.trials}: more than the {size} configurations of "
                         f"the {family.name} family's space for {problem}; give at most "
                         f"{size}")


def _at_least(*checks: tuple[str, int | float | None, int]) -> None:
    """Refuse a count below what it can be: a command given 0 repeats or cases would exit
    0 having done nothing."""
    for option, value, least in checks:
        if value is not None and value < least:
            raise ValueError(f"{option} must be at least {least}, not {value}")


def _check_storage_url(text: str | None) -> None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if text is None:
        return
    if text.startswith("journal:"):
        if not text.removeprefix("journal:"):
            raise ValueError("--storage journal: names no file (journal:PATH)")
        return
    try:
        make_url(text)
    except ArgumentError:
        raise ValueError(f"--storage {text!r}: expected an SQLAlchemy URL "
                         "(postgresql+psycopg://USER@HOST/DB) or journal:PATH") from None


def _check_tune_arguments(args: argparse.Namespace) -> None:
    _at_least(("--compile-workers", args.compile_workers, 1),
              ("--ahead-workers", args.ahead_workers, 0), ("--in-flight", args.in_flight, 1),
              ("--trials", args.trials, 1), ("--vec", args.vec, 1),
              ("--worker-count", args.worker_count, 1), ("--worker-index", args.worker_index, 0),
              ("--compile-top", args.compile_top, 0))
    if args.vec > MAX_INDEX:
        raise ValueError(f"--vec must be at most {MAX_INDEX} (the kernels hold L in a 32-bit "
                         f"int), not {args.vec}")
    if not args.time_budget > 0:
        raise ValueError(f"--time-budget must be a positive number of seconds, not "
                         f"{args.time_budget}")
    if args.worker_index >= args.worker_count:
        raise ValueError(f"--worker-index {args.worker_index} is not below --worker-count "
                         f"{args.worker_count}")
    _check_storage_url(args.storage)


def _tune(args: argparse.Namespace) -> int:
    from .store.database import check_writable, database_url, default_url
    from .tune.command import (
        check_needs,
        default_trials,
        device_list,
        start_compile_pool,
        tune_here,
        tune_on_devices,
    )
    from .tune.storage import check_storage, default_storage_url

    args.trials_given = args.trials is not None
    if args.trials is None:
        args.trials = default_trials(args.quick)
    _check_tune_arguments(args)
    check_needs(args)  # nvcc, CuPy, the driver: before any work
    db_url = database_url(args.db) if args.db else default_url()
    check_writable(db_url, adopt=args.force_db)
    tasks = _tasks(args)  # may fork (the enumeration): before the pool's threads exist
    pool = start_compile_pool(args)  # loading while CUDA starts and the first seeds rank
    try:
        devices = device_list(args.devices)
        workers = max(len(devices), args.worker_count)
        storage_url = args.storage or default_storage_url(db_url)
        check_storage(storage_url, workers)
        if devices:
            return tune_on_devices(args, devices, db_url, storage_url)
        return tune_here(args, tasks, db_url, storage_url, pool)
    finally:
        if pool is not None:
            pool.close()


def _show(args: argparse.Namespace) -> int:
    """The tuned table of ``--db``; by default of your database, then of the shipped one."""
    from .store.database import default_url, shipped_db

    if args.db:
        _show_table(args.db)
        return 0
    for url in (default_url(), f"sqlite:///{shipped_db()}"):
        if Path(url.removeprefix("sqlite:///")).exists() or not url.startswith("sqlite:///"):
            print(f"# {url}")
            _show_table(url)
    return 0


def _show_table(url: str) -> None:
    from .policy import summary
    from .store.database import connect

    rows = summary(connect(url, writable=False))
    print(f"{'gpu':8} {'family':6} {'dtype':5} {'pattern':8} {'L':>4} {'A':3} {'M':>6} "
          f"{'N':>6} {'K':>6} {'trials':>6} {'ms':>9} {'TFLOP/s':>8} {'model_ms':>9}  best")
    for r in sorted(rows, key=lambda r: (r["gpu"], r["family"], r["pattern"], r["shape"])):
        m, n, k = r["shape"]
        ms = f"{r['time_ms']:.4f}" if r["time_ms"] and r["measured"] else "-"
        tf = f"{r['tflops']:.1f}" if r["tflops"] and r["measured"] else "-"
        model = f"{r['model_ms']:.4f}" if r["model_ms"] else "-"
        best = r["best"] or "-"
        if r["best"] and not r["measured"]:
            best += "  (model's choice, not measured)"
        print(f"{r['gpu']:8} {r['family']:6} {r['dtype']:5} {r['pattern']:8} {r['vec']:>4} "
              f"{r['a_layout']:3} {m:>6} {n:>6} {k:>6} {r['trials']:>6} {ms:>9} {tf:>8} "
              f"{model:>9}  {best}")


def _carry(args: argparse.Namespace) -> int:
    from .store.database import connect
    from .tune.carry import carry, tree_of_revision
    from .tune.maintain import (
        lacking_references,
        print_plan,
        remeasure,
        scratch_copy,
        time_references,
    )

    _at_least(("--remeasure", args.remeasure, 0))
    with tempfile.TemporaryDirectory() as tmp:
        root = args.tree or tree_of_revision(args.repo, args.from_rev, Path(tmp) / "old")
        url = scratch_copy(args.db, Path(tmp)) if args.plan else args.db
        engine = connect(url)
        patterns = _pattern_set(args.pattern)
        report = carry(engine, root, top=args.remeasure, patterns=patterns)
        print(report, flush=True)
        if args.plan:
            print_plan(report, args.remeasure)
        elif report.remeasure:
            remeasure(engine, report.remeasure, args.dry_run, args.quiet)
        if args.remeasure > 0:
            lacking = {key: ref for key, ref in lacking_references(engine, patterns).items()
                       if ref[0] not in report.remeasure.get(key, [])}
            time_references(engine, lacking, args.dry_run, args.plan, args.quiet)
    return 0


def _reference_times(args: argparse.Namespace) -> int:
    from .store.database import connect
    from .tune.maintain import lacking_references, time_references

    engine = connect(args.db)
    time_references(engine, lacking_references(engine, _pattern_set(args.pattern)),
                    args.dry_run, args.plan, args.quiet)
    return 0


def _refine(args: argparse.Namespace) -> int:
    from .store.database import connect
    from .tune.maintain import remeasure
    from .tune.refine import refinement_candidates

    _at_least(("--top", args.top, 1), ("--workers", args.workers, 1))
    engine = connect(args.db)
    variants = refinement_candidates(engine, _pattern_set(args.pattern), top=args.top,
                                     min_gain=args.min_gain, family_name=args.family)
    kernels = {c.name: c for configs in variants.values() for c in configs}
    verb = "would be timed" if args.plan else "timed"
    print(f"refinements {verb} on {len(variants)} problems ({len(kernels)} distinct kernels)",
          flush=True)
    if variants and not args.plan:
        if not args.dry_run:  # compile them all at once, not one a problem
            from .compiler.pool import precompile

            for error in precompile(list(kernels.values()), workers=args.workers):
                print(f"compile error: {error}", file=sys.stderr, flush=True)
        remeasure(engine, variants, args.dry_run, args.quiet)
    return 0


def _export(args: argparse.Namespace) -> int:
    from .export import export_from_db, export_kernel, load_config

    if args.from_db:
        if not args.shapes:
            raise ValueError("export --from-db needs --shapes FILE")
        print(export_from_db(args.db, read_shapes(args.shapes), args.out, args.cubin,
                             args.quiet))
        return 0
    if not args.config:
        raise ValueError("export needs --config NAME|FILE.json or --from-db --shapes FILE")
    for spec in args.config:
        for path in export_kernel(load_config(spec), args.out, cubin=args.cubin):
            print(path)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .bench.results import summary_table
    from .bench.run import bench_to_dir

    _at_least(("--repeat", args.repeat, 1), ("--vec", args.vec, 1))

    if args.decode or DType.parse(args.dtype) is not DType.F32:  # against PyTorch's GEMM
        from .bench.decode import decode_bench_to_dir
        from .bench.decode import summary_table as decode_table

        rows, paths = decode_bench_to_dir(
            read_shapes(args.shapes), _patterns(args.pattern), args.vec,
            DType.parse(args.dtype), args.db, args.out, args.repeat,
            "nmgen " + " ".join(sys.argv[1:]), args.quiet, ALayout(args.layout),
            not args.no_plots)
        print(decode_table(rows))
        print("\n".join(str(p) for p in paths))
        return 0

    rows, paths = bench_to_dir(read_shapes(args.shapes), _patterns(args.pattern), args.vec,
                               ALayout(args.layout), args.db, args.out, args.repeat,
                               not args.no_plots, "nmgen " + " ".join(sys.argv[1:]),
                               args.quiet)
    print(summary_table(rows))
    print("\n".join(str(p) for p in paths))
    wrong = sum(not r.correct for r in rows)
    if wrong:
        print(f"nmgen bench: {wrong} results differ from the float64 reference",
              file=sys.stderr)
    return 1 if wrong else 0


def _bench_untuned(args: argparse.Namespace) -> int:
    from .bench.untuned import parse_problems, plan, plan_table, untuned_to_dir
    from .dispatch import Dispatcher
    from .runtime.device import device_info, table_device
    from .store.database import database_url, shipped_db

    _at_least(("--repeat", args.repeat, 1))
    dtype = DType.parse(args.dtype)
    device = table_device(args.plan) if args.plan else device_info()
    untuned_urls = [database_url(u) for u in args.untuned_db or [f"sqlite:///{shipped_db()}"]]
    untuned = Dispatcher(untuned_urls, device=device, write_url="")
    tuned = Dispatcher([database_url(args.tuned_db)], device=device, write_url="")
    planned = plan(parse_problems(args.problems), read_shapes(args.shapes), untuned, tuned,
                   device.arch, ALayout(args.layout), dtype, quick=args.quick)
    if args.plan:
        print(plan_table(planned), end="")
        return 0
    rows, paths = untuned_to_dir(planned, args.out, args.repeat,
                                 "nmgen " + " ".join(sys.argv[1:]), args.quiet)
    print("\n".join(str(p) for p in paths))
    return 0


def _plot(args: argparse.Namespace) -> int:
    import json

    from .bench.plots import all_plots
    from .bench.results import markdown_report, read_csv

    rows = read_csv(args.dir / "bench.csv")
    record = json.loads((args.dir / "bench.json").read_text())
    (args.dir / "bench.md").write_text(markdown_report(rows))
    print(args.dir / "bench.md")
    for path in all_plots(rows, record["ceilings"], args.dir, record.get("device", "")):
        print(path)
    return 0


def _selftest(args: argparse.Namespace) -> int:
    from .bench.selftest import selftest, write
    from .families.registry import all_families, get
    from .progress import Progress

    _at_least(("--cases", args.cases, 1), ("--per-config", args.per_config, 1),
              ("--max-size", args.max_size, 1))
    families = [get(args.family)] if args.family else list(all_families())
    with Progress(args.cases * len(families), "cases", args.quiet) as bar:
        outcome = selftest(args.cases, args.seed, per_config=args.per_config,
                           max_size=args.max_size, families=families,
                           log=lambda s: print(s, file=sys.stderr, flush=True),
                           advance=bar.advance)
    for name, count in outcome.cases.items():
        print(f"{name}: {count} cases, {outcome.wrong[name]} wrong (seed {args.seed})")
    if args.out:
        write(outcome, args.out, args.seed, args.cases)
    return 1 if any(outcome.wrong.values()) else 0


def _add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bar (none is drawn where stderr is no terminal)")


def _add_timing_options(parser: argparse.ArgumentParser) -> None:
    """What the commands that time kernels on tuned problems take."""
    parser.add_argument("--db", help="SQLAlchemy URL of the tuned database")
    parser.add_argument("--pattern", help="only these patterns' problems (16:32,8:32)")
    parser.add_argument("--dry-run", action="store_true", help="the model's estimates (no GPU)")
    parser.add_argument("--plan", action="store_true", help="only count the problems")
    _add_quiet(parser)


def _add_problem_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pattern", default="16:32,12:32,8:32,4:32",
                        help="n:m patterns, comma-separated (default: %(default)s)")
    parser.add_argument("--vec", type=int, default=32,
                        help="vector length L (default: %(default)s)")
    parser.add_argument("--layout", choices=[a.value for a in ALayout], default="rm",
                        help="A layout: rm (row-major M×K) or km (K-major) "
                        "(default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nmgen", description="N:M sparse GEMM kernel "
                                     "compiler and autotuner")
    parser.add_argument("--version", action="version", version=f"nmgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    tune = sub.add_parser("tune", help="tune kernels for a GPU and a list of shapes")
    tune.add_argument("--gpu", required=True, help="GPU table entry, e.g. h100")
    tune.add_argument("--shapes", type=Path, required=True, help="file of 'M N K' lines")
    _add_problem_options(tune)
    tune.add_argument("--dtype", default="f32", help="values and activations: f32, bf16 or "
                      "f16 (default: %(default)s)")
    tune.add_argument("--family", help="tune only this kernel family (default: every "
                      "family serving the problem, each where it can win: gemv at M <= 64)")
    tune.add_argument("--trials", type=int, default=None,
                      help="trials per problem (default: 40; 8 with --quick)")
    tune.add_argument("--quick", action="store_true",
                      help="a shapes file in minutes: 8 trials a problem, starting from "
                      "the kernels of other tuned patterns and vector lengths and the "
                      "model's best three; two finalists timed again, no cross-check")
    tune.add_argument("--time-budget", type=float, default=math.inf, help="seconds in all")
    tune.add_argument("--db", help="SQLAlchemy URL of the tuned database")
    tune.add_argument("--force-db", action="store_true",
                      help="write into a --db that holds another program's tables (adding "
                      "nmgen's to them)")
    tune.add_argument("--storage", help="Optuna storage: an SQLAlchemy URL or journal:PATH "
                      "(default: a journal file beside a SQLite --db, else the --db URL)")
    tune.add_argument("--dry-run", action="store_true",
                      help="search with the model as the measure (recorded as status "
                      "'model') and compile the top configurations with nvcc where it is on "
                      "PATH; no GPU, no CuPy")
    tune.add_argument("--compile-top", type=int, default=None,
                      help="dry run: compile this many best configurations a problem with "
                      "nvcc (default: 4 where nvcc is on PATH, else 0)")
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
    _add_quiet(tune)
    tune.set_defaults(run=_tune)

    show = sub.add_parser("show", help="table of tuned results")
    show.add_argument("--db", help="SQLAlchemy URL of the tuned database")
    show.set_defaults(run=_show)

    carry = sub.add_parser("carry", help="keep the tuned records of kernels that a newer "
                           "template or code generator renders unchanged")
    made_by = carry.add_mutually_exclusive_group(required=True)
    made_by.add_argument("--from-rev", help="git revision whose generator made the records")
    made_by.add_argument("--tree", type=Path, help="... or its source tree (nmgen/)")
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
    _add_quiet(carry)
    carry.set_defaults(run=_carry)

    reference = sub.add_parser("reference-times", help="time each family's reference "
                               "kernel on every tuned problem whose records lack it "
                               "(carry --remeasure does this too)")
    _add_timing_options(reference)
    reference.set_defaults(run=_reference_times)

    refine = sub.add_parser("refine", help="time the families' refinements of tuned "
                            "problems' fastest kernels (e.g. stream-K twins, gemv's wide "
                            "sum) where the model expects them faster")
    _add_timing_options(refine)
    refine.add_argument("--top", type=int, default=1,
                        help="refinements of each problem's TOP fastest kernels "
                        "(default: %(default)s)")
    refine.add_argument("--min-gain", type=float, default=0.05,
                        help="the model's expected gain a refinement needs "
                        "(default: %(default)s)")
    refine.add_argument("--family", help="only this kernel family's problems")
    refine.add_argument("--workers", type=int, default=16, help="compile processes")
    refine.set_defaults(run=_refine)

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
    _add_quiet(export)
    export.set_defaults(run=_export)

    bench = sub.add_parser("bench", help="nmgen (through dispatch) against cuBLAS, with "
                           "tables and plots")
    bench.add_argument("--shapes", type=Path, required=True, help="file of 'M N K' lines")
    _add_problem_options(bench)
    bench.add_argument("--db", help="your tuned database (default: yours, then shipped)")
    bench.add_argument("--repeat", type=int, default=20,
                       help="timed runs (median; default: %(default)s)")
    bench.add_argument("--out", type=Path, default=Path("bench_out"), help="output directory")
    bench.add_argument("--no-plots", action="store_true", help="tables only")
    bench.add_argument("--decode", action="store_true",
                       help="small M as a model runs it: weights out of L2 between calls, "
                       "bandwidth against a device copy, cuBLAS at --dtype and, for 2:4, "
                       "PyTorch's semi-structured sparse path")
    bench.add_argument("--dtype", default="f32", help="f32, bf16 or f16; bf16 and f16 (and "
                       "--decode) time PyTorch's dense GEMM of that dtype as the baseline, "
                       "any M (default: %(default)s)")
    _add_quiet(bench)
    bench.set_defaults(run=_bench)

    untuned = sub.add_parser("bench-untuned", help="problems nobody tuned: dispatch's first "
                             "choice against a full tune and cuBLAS's dense GEMM of the "
                             "same dtype, in one process")
    untuned.add_argument("--shapes", type=Path, required=True, help="file of 'M N K' lines")
    untuned.add_argument("--problems", required=True, help="PATTERN/L, comma-separated "
                         "(e.g. 2:4/32,1:4/32,2:8/32,8:32/16,8:32/64,8:32/128)")
    untuned.add_argument("--layout", choices=[a.value for a in ALayout], default="rm",
                         help="A layout (default: %(default)s)")
    untuned.add_argument("--dtype", default="f32", help="f32, bf16 or f16: of A, the weight "
                         "and the output; the dense baseline is cuBLAS SGEMM for f32, its "
                         "BF16 or FP16 GEMM (FP32 accumulate) at 16 bits "
                         "(default: %(default)s)")
    untuned.add_argument("--tuned-db", required=True,
                         help="the database holding a full tune of these problems")
    untuned.add_argument("--untuned-db", action="append", help="a database dispatch reads "
                         "for the untuned choice, repeatable (default: the shipped one); "
                         "none may hold these problems")
    untuned.add_argument("--quick", action="store_true", help="also time the kernels a "
                         "quick tune would time (quick_ms: the fastest of them)")
    untuned.add_argument("--repeat", type=int, default=20,
                         help="timed runs (median; default: %(default)s)")
    untuned.add_argument("--out", type=Path, default=Path("untuned_out"),
                         help="output directory")
    untuned.add_argument("--plan", metavar="GPU", help="only list the kernels each row "
                         "would time on this GPU table entry (no GPU needed)")
    _add_quiet(untuned)
    untuned.set_defaults(run=_bench_untuned)

    selftest = sub.add_parser("selftest", help="random cases of every family on the GPU "
                              "against float64 (odd shapes, M from 1, edges)")
    selftest.add_argument("--cases", type=int, default=1000,
                          help="cases a family (default: %(default)s)")
    selftest.add_argument("--seed", type=int, default=0, help="default: %(default)s")
    selftest.add_argument("--family", help="only this family")
    selftest.add_argument("--per-config", type=int, default=20,
                          help="shapes a configuration (default: %(default)s)")
    selftest.add_argument("--max-size", type=int, default=384,
                          help="largest M, N and K drawn (default: %(default)s)")
    selftest.add_argument("--out", type=Path, help="JSON of the counts and minimal failures")
    _add_quiet(selftest)
    selftest.set_defaults(run=_selftest)

    plot = sub.add_parser("plot", help="redraw the tables and plots of a recorded bench "
                          "output")
    plot.add_argument("dir", type=Path, help="an nmgen bench --out directory")
    plot.set_defaults(run=_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ConfigError, ShapeFileError, ValueError, TypeError, RuntimeError) as exc:
        print(f"nmgen {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file or folder the command cannot read or write
        where = f" {exc.filename}" if exc.filename else ""
        print(f"nmgen {args.command}: error:{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # where the command says nothing more itself
        print(f"nmgen {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        reason = _database_failure(exc)
        if reason is None:
            raise
        print(f"nmgen {args.command}: error: {reason}", file=sys.stderr)
        return 2


def _database_failure(exc: Exception) -> str | None:
    """A database's own failure in mid-command (a damaged file, a server gone) in a line;
    ``None`` for any other exception (a bug: its traceback is wanted)."""
    orig = getattr(exc, "orig", None)
    if not type(exc).__module__.startswith("sqlalchemy") or orig is None:
        return None
    return (f"the database failed: {type(orig).__name__}: {orig} (a damaged SQLite file "
            "answers 'PRAGMA integrity_check'; restore it or give another --db)")


if __name__ == "__main__":
    sys.exit(main())
