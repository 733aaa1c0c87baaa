"""The ``nmgen tune`` command: the worker of this process, or one
worker process a GPU (``--devices``) under a supervisor, and the dry run's report."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from ..codegen import render
from ..compiler.pool import CompilePool
from ..families.base import Config
from ..families.registry import config_from_dict
from ..progress import Progress
from ..store.database import connect, database_url, shipped_db
from ..store.tables import TrialStatus
from .storage import open_storage
from .tuner import Tuner, default_ahead_workers
from .workers import run_worker, supervise

TRIALS = 40
INTERRUPTED = 130  # the exit status of a command ended by SIGINT (128 + 2)
# ``nmgen tune --quick``: a shapes file in minutes. A study of 8 trials starts from the
# kernels of other tuned patterns and vector lengths adapted to it and the model's best
# three; two finalists are timed again; no cross-check of the neighbours' winners.
QUICK_TRIALS = 8
QUICK = {"model_seed_count": 3, "transfer_seed_count": 3, "finalists": 2,
         "cross_checks": False}


# A dry run compiles the model's best this many configurations a problem (with nvcc).
COMPILE_TOP = 4


def default_trials(quick: bool) -> int:
    return QUICK_TRIALS if quick else TRIALS


def tuner_options(quick: bool) -> dict:
    """The ``Tuner`` fields ``--quick`` sets (none without it)."""
    return dict(QUICK) if quick else {}


def check_needs(args: argparse.Namespace) -> None:
    """What the run needs, checked before any work (the enumeration alone takes seconds):
    a dry run compiles the model's best configurations with nvcc (``--compile-top``; by
    default 4 where nvcc is found, else none, said so); a run that measures needs CuPy and
    a CUDA driver."""
    if args.dry_run:
        args.compile_top = dry_run_compiles(args.compile_top)
        return
    from ..compiler.nvrtc import cupy
    from ..runtime.device import driver_present

    cupy()  # the install hint where CuPy is missing
    if not driver_present():
        raise RuntimeError("no CUDA driver on this machine (libcuda does not load): "
                           "measuring kernels needs an NVIDIA GPU and its driver; "
                           "tune --dry-run needs neither")


def dry_run_compiles(top: int | None) -> int:
    """How many of the model's best configurations a dry run compiles a problem."""
    from ..compiler.nvcc import nvcc_path

    found = nvcc_path() is not None
    if top is None:
        if not found:
            print("nmgen tune: nvcc is not on PATH: the dry run compiles none of the "
                  "model's best configurations (--compile-top 0 says so; install the CUDA "
                  "toolkit to see their registers and spills)", file=sys.stderr, flush=True)
        return COMPILE_TOP if found else 0
    if top > 0 and not found:
        raise RuntimeError(f"--compile-top {top}: a dry run compiles the model's best "
                           f"configurations with nvcc, which is not on PATH: install the "
                           "CUDA toolkit, or give --compile-top 0")
    return top


def transfer_engines(db_url: str) -> tuple:
    """The shipped database, read only, where the tune writes elsewhere: transfer seeds
    come from its records too."""
    path = shipped_db()
    if not path.exists() or database_url(db_url) == f"sqlite:///{path}":
        return ()
    return (connect(f"sqlite:///{path}", writable=False),)


def process_age() -> float:
    """Seconds since this process started (Linux: /proc), imports included."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return math.nan


def device_list(text: str | None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each worker that ``--devices`` asks for: its
    indices count the GPUs this process sees, so under ``CUDA_VISIBLE_DEVICES=2,3``,
    ``0,1`` and ``all`` both mean GPUs 2 and 3."""
    if not text:
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = None if env is None else [d.strip() for d in env.split(",") if d.strip()]
    if text == "all":
        if visible is None:
            from ..runtime.device import device_count

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


def tune_on_devices(args: argparse.Namespace, devices: list[str], db_url: str,
               storage_url: str) -> int:
    # tables and storage made once, before the workers race to make them
    connect(db_url, adopt=args.force_db)
    open_storage(storage_url)

    def child_argv(index: int, _device: str) -> list[str]:
        argv = ["tune", "--gpu", args.gpu, "--shapes", str(args.shapes), "--pattern",
                args.pattern, "--vec", str(args.vec), "--layout", args.layout, "--dtype",
                args.dtype, *(["--family", args.family] if args.family else []), "--trials",
                str(args.trials), "--db", db_url, "--storage", storage_url,
                "--worker-index", str(index), "--worker-count", str(len(devices)),
                *(["--compile-top", str(args.compile_top)] if args.compile_top is not None
                  else []), *(["--quick"] if args.quick else [])]
        if math.isfinite(args.time_budget):
            argv += ["--time-budget", str(args.time_budget)]
        for option, value in (("--compile-workers", args.compile_workers),
                              ("--ahead-workers", args.ahead_workers),
                              ("--in-flight", args.in_flight)):
            argv += [option, str(value)] if value is not None else []
        return argv + ["--quiet"] + (["--dry-run"] if args.dry_run else [])

    start = time.monotonic()
    try:
        code = supervise(child_argv, devices, storage_url,
                         lambda s: print(f"nmgen tune: {s}", file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        print(f"nmgen tune: interrupted: every trial the workers finished is kept in "
              f"{db_url} (storage {storage_url}); run the same command again to resume",
              file=sys.stderr, flush=True)
        return INTERRUPTED
    print(f"{len(devices)} workers finished in {time.monotonic() - start:.1f} s "
          f"(storage {storage_url}, results in {db_url})")
    return code


def compile_processes(args: argparse.Namespace) -> tuple[int, int]:
    """How many compile processes a worker has: for the batches timed next, and for the
    next studies' seeds (``--compile-workers``, ``--ahead-workers``, else the defaults)."""
    workers = Tuner.workers if args.compile_workers is None else args.compile_workers
    ahead = default_ahead_workers(workers) if args.ahead_workers is None else args.ahead_workers
    return workers, ahead


def start_compile_pool(args: argparse.Namespace) -> CompilePool | None:
    """The compile processes of a worker that compiles (not a dry run, not the supervisor
    of ``--devices``), started as soon as it has its problems: they spawn and load CuPy
    and NVRTC (seconds) while this process initialises CUDA and ranks its first studies'
    seeds, instead of from when it queues those. Each of four workers on one host took
    ~4 s from that point to its first study, one alone 1.9 s (docs/engineering-notes.md
    §10)."""
    if args.dry_run or args.devices:
        return None
    pool = CompilePool(*compile_processes(args))
    pool.start()
    return pool


def tune_here(args: argparse.Namespace, tasks: list, db_url: str, storage_url: str,
              pool: CompilePool | None = None) -> int:
    """This process's worker; ``pool``: its compile processes, started already."""
    if not args.dry_run:
        from ..gpus import check_device
        from ..runtime.device import device_info

        info = device_info()
        check_device(tasks[0].gpu, info.name, info.sms, info.major, info.minor)
    prefix = f"[worker {args.worker_index}] " if args.worker_count > 1 else ""
    workers, ahead = compile_processes(args)
    tuner = Tuner(connect(db_url, adopt=args.force_db), open_storage(storage_url),
                  trials=args.trials,
                  dry_run=args.dry_run, workers=workers,
                  ahead_workers=0 if args.dry_run else ahead,
                  in_flight=args.in_flight or Tuner.in_flight,
                  log=lambda s: print(prefix + s, file=sys.stderr, flush=True),
                  transfer_engines=transfer_engines(db_url), _compile_pool=pool,
                  **tuner_options(args.quick))
    done = [t for t in tasks if tuner.open_work(t)[0] >= tuner.trials]
    if len(done) == len(tasks):
        print(f"{prefix}all {len(tasks)} problems already have their {tuner.trials} trials in "
              f"{db_url}: nothing to tune")
        tuner.close()
        return 0
    if not args.dry_run:
        tuner.log(f"set up {process_age():.1f} s after the process started; compile "
                  f"processes: {workers} for the batches timed next, {ahead} for the next "
                  f"studies' seeds; {tuner.in_flight} studies at once")
    try:
        with Progress(len(tasks), "studies", args.quiet) as bar:
            report = run_worker(tuner, tasks, args.time_budget, args.worker_index,
                                args.worker_count, log=tuner.log, on_study_done=bar.advance)
    except KeyboardInterrupt:
        print(prefix + interrupted(tuner, tasks, db_url), file=sys.stderr, flush=True)
        return INTERRUPTED
    finally:
        closing = time.monotonic()
        tuner.close()
    print(f"{prefix}worked on {report.studies} problems; {report.complete} of "
          f"{report.total} complete; {report.seconds:.1f} s ({report.phases}, other "
          f"{report.seconds - report.phases.total():.2f} s); "
          f"compile processes closed in {time.monotonic() - closing:.1f} s; "
          f"results in {db_url}")
    if (summary := tuner.compile_summary()) is not None:
        print(prefix + summary)
    if args.dry_run and args.compile_top > 0:
        print_dry_run(tuner, tasks, args.compile_top)
    return 0


def interrupted(tuner: Tuner, tasks: list, db_url: str) -> str:
    """What an interrupted tune kept, and how to go on."""
    done = [tuner.open_work(t)[0] for t in tasks]
    complete = sum(n >= tuner.trials for n in done)
    return (f"interrupted: {complete} of {len(tasks)} problems complete, {sum(done)} trials "
            f"kept in {db_url} (each problem's best so far among them); run the same "
            "command again to resume")


def print_dry_run(tuner, tasks: list, top: int) -> None:
    """The model's best configurations of each problem, compiled with nvcc."""
    from ..store.records import trials_of
    from .measurers import ModelMeasurer

    for i, task in enumerate(tasks, 1):
        print(f"[{i}/{len(tasks)}] {tuner.study_name(task)}", flush=True)
        rows = [r for r in trials_of(tuner.engine, ModelMeasurer(task).key)
                if r.status == TrialStatus.MODEL]
        rows.sort(key=lambda r: (r.time_ms, r.config_row.name))
        best = rows[:top]
        compiled = compile_report([config_from_dict(r.config_row.params) for r in best])
        for rank, (row, res) in enumerate(zip(best, compiled, strict=True), 1):
            print(f"  {rank}. {res['config']}  model {row.time_ms:.4f} ms "
                  f"regs={res['registers']} spills={res['spills']}")


def compile_report(configs: list[Config]) -> list[dict]:
    """Compile ``configs`` with nvcc for their arch (no GPU needed): registers, spills."""
    from concurrent.futures import ThreadPoolExecutor

    from ..compiler.nvcc import compile_with_nvcc

    with ThreadPoolExecutor(max_workers=4) as pool:  # nvcc runs as a child process
        compiled = list(pool.map(lambda c: compile_with_nvcc(render(c)), configs))
    rows = []
    for config, result in zip(configs, compiled, strict=True):
        res = result.resources[config.name]
        rows.append({"config": config.name, "registers": res.registers,
                     "spills": res.spill_stores + res.spill_loads})
    return rows
