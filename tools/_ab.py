"""What the A/B tools (unroll_ab.py, template_ab.py, stream_k_ab.py, ...) share. A variant
is another source of one configuration (same name and launch, other code): compiled on the
host with nvcc for a table of compile time, registers and SASS, or through NVRTC on the GPU
machine before it is timed."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from _sass import opcode

from nmgen.codegen import KernelSource
from nmgen.compile import compile_with_nvcc
from nmgen.config import ALayout, Arch, KernelConfig
from nmgen.format import Pattern
from nmgen.gpu.launch import NVRTC_OPTIONS
from nmgen.space import CORE_BEST, Problem, core_config

SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(\S.*)$")


def problem_inputs(pattern: Pattern, layout: ALayout, rows: int, cols: int, depth: int):
    """(a, b, out, ref) on the GPU: random A in ``layout``, a random L = 32 weight, the
    output poisoned with NaN, and the float64 product to check against."""
    import cupy as cp

    from nmgen.gpu.bench import dense_float64, random_weight

    a = cp.random.standard_normal((rows, depth), dtype=cp.float32)
    if layout is ALayout.K_MAJOR:
        a = cp.ascontiguousarray(a.T).T
    b = random_weight(pattern.n, pattern.m, 32, depth, cols)
    out = cp.full((rows, cols), cp.nan, cp.float32)
    return a, b, out, a.astype(cp.float64) @ dense_float64(b)


def at_kernel_entry(source: KernelSource, main: str = "", transpose: str = "",
                    preamble: str = "") -> KernelSource:
    """``source`` with a line of code at the top of its main kernel and of its transpose
    kernel (where given and present), and ``preamble`` before the template's namespace:
    probes and launch variants of the tools, on the template's own code."""
    code = source.code
    name = re.escape(source.name)
    for pattern, line in ((rf"\n{name}\(", main), (rf"\n{name}_transpose\(", transpose)):
        match = re.search(pattern, code) if line else None
        if match is not None:
            body = code.index(") {\n", match.end()) + len(") {\n")
            code = code[:body] + f"    {line}\n" + code[body:]
    first = code.index("namespace {")
    return KernelSource(source.config, code[:first] + preamble + code[first:])


def compiled_module(kernel):
    """The CuPy module ``kernel`` launches from, captured as it compiles (for the
    ``__device__`` globals of a probe: ``module.get_global(name)``)."""
    import cupy as cp

    made, original = [], cp.RawModule

    def capture(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    cp.RawModule = capture
    try:
        kernel._compiled(cp.cuda.runtime.getDevice())
    finally:
        cp.RawModule = original
    return made[-1]


def core_pair(pattern: Pattern):
    """(K-major kernel, row-major tx kernel) of the core configuration of ``pattern``, L = 32,
    on this GPU."""
    from nmgen.gpu.launch import Kernel, device_info

    arch = device_info().arch
    return tuple(Kernel(core_config(Problem(pattern.n, pattern.m, 32, layout, arch)))
                 for layout in (ALayout.K_MAJOR, ALayout.ROW_MAJOR))


def row_major_core(pattern: Pattern, size: int, shape: tuple[int, int, int] | None = None):
    """(a, b, out, ref, km, tx, fns) of a size^3 problem (or ``shape``, M x N x K) for the
    pipeline tools: row-major A and its K-major twin, the core kernels of both layouts, and
    ``fns`` holding the K-major kernel (the bound) and the shipped row-major launch, each
    writing ``out``."""
    import cupy as cp

    a, b, out, ref = problem_inputs(pattern, ALayout.ROW_MAJOR, *(shape or (size,) * 3))
    a_km = cp.ascontiguousarray(a.T).T
    km, tx = core_pair(pattern)
    fns = {f"km {km.name}": lambda i: km(a_km, b, out=out),
           f"tx {tx.name}": lambda i: tx(a, b, out=out)}
    return a, b, out, ref, km, tx, fns


_GREATEST_STREAMS: dict[int, tuple] = {}


def greatest_streams(device: int) -> tuple:
    """Two non-blocking streams of the greatest priority, made once: the pipelined call's
    streams from the twenty-ninth session to the thirty-second, which waited for the
    caller's stream before copy 0 and which it waited for at the end (the launcher now
    runs the even chunks on the caller's stream, ``launch._second_stream`` the odd)."""
    if device not in _GREATEST_STREAMS:
        from nmgen.gpu import launch

        cp = launch._cupy()
        with cp.cuda.Device(device):
            greatest = launch._priority_range()[1]
            _GREATEST_STREAMS[device] = tuple(
                cp.cuda.Stream(non_blocking=True, priority=greatest) for _ in range(2))
    return _GREATEST_STREAMS[device]


def one_copy_twin(config: KernelConfig):
    """A kernel of ``config`` whose row-major launches copy all of A at once (the pipelined
    copy off), with launch plans of its own beside the shipped kernel's."""
    from nmgen.gpu.launch import Kernel

    kernel = Kernel(config)
    kernel.pipeline_copy = False
    kernel._source_key = (kernel._source_key, "one copy")
    return kernel


def pattern_tables(args: argparse.Namespace, title: str, one) -> None:
    """The pipeline tools' main: ``one(pattern, size, args)`` rows for each of
    ``args.pattern``, under a header, written to ``args.out`` if given."""
    from nmgen.gpu.launch import device_info

    lines = [f"# {title} ({device_info().name}, M = N = K = {args.size})", "",
             "| pattern | version | ms | over km |", "| --- | --- | --- | --- |"]
    for text in args.pattern.split(","):
        lines += one(Pattern.parse(text), args.size, args)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def float_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def pipeline_tool(doc: str, title: str, one, extra=None, pattern: str = "4:32,8:32") -> None:
    """A pipeline tool's command line (--pattern, --size, --rounds, --out, and the tool's
    own options, which ``extra(parser)`` adds), then ``pattern_tables``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--pattern", default=pattern)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path)
    if extra is not None:
        extra(parser)
    pattern_tables(parser.parse_args(), title, one)


def checked_ratios(fns: dict, out, ref, label: str, rounds: int,
                   queue_ahead_us: float | None = None) -> list[str]:
    """Every version in ``fns`` (name -> call(i), each writing ``out``) checked against the
    float64 ``ref`` on a poisoned output, then all timed in turns; a table row each,
    "| label | name | ms | over the first version |", printed as it comes."""
    from nmgen.gpu import measure
    from nmgen.gpu.timing import QUEUE_AHEAD_US, time_in_turns

    for name, fn in fns.items():
        err = measure.poisoned_error(lambda fn=fn: fn(0), out, ref)
        if not err < 1e-5:
            raise RuntimeError(f"{name} is wrong: relative error {err:.3g}")
    times = time_in_turns(fns, rounds=rounds, repeat=10,
                          queue_ahead_us=QUEUE_AHEAD_US if queue_ahead_us is None
                          else queue_ahead_us)
    bound = next(iter(times.values()))
    lines = []
    for name, t in times.items():
        lines.append(f"| {label} | {name} | {t:.4f} | {t / bound:.3f} |")
        print(lines[-1], flush=True)
    return lines


def save_report(out: Path | None, stem: str, text: str, record: dict) -> None:
    """Print an A/B tool's markdown report, and with ``out`` write it and its raw record
    there as STEM.md and STEM.json."""
    print(text)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.md").write_text(text + "\n")
        (out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")


def add_variant_args(parser: argparse.ArgumentParser, nvcc_help: str) -> None:
    """The options both A/B tools take: the kernels, the problem size, the output folder
    and the host-only nvcc mode (with SASS counts where cuobjdump is found)."""
    parser.add_argument("--configs", default="", help="kernel names (default: the core's best)")
    parser.add_argument("--winners", type=int, default=0, metavar="N",
                        help="instead: the N most frequent tuned winners of each pattern "
                             "and layout in the shipped tuned_db/")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump"),
                        help="with --nvcc-only: count the SASS too")
    parser.add_argument("--nvcc-only", action="store_true", help=nvcc_help)


def configs_of(names: str, arch: Arch, winners: int = 0) -> list[KernelConfig]:
    """The comma-separated kernel names, the ``winners`` most frequent tuned winners of
    each pattern and layout, or by default the core benchmark's best kernels."""
    if names:
        return [KernelConfig.from_name(n) for n in names.split(",")]
    if winners:
        return [KernelConfig.from_name(n) for n in frequent_winners(winners)]
    return [core_config(Problem(n, m, 32, layout, arch)) for n, m, layout in CORE_BEST]


def frequent_winners(count: int) -> list[str]:
    """The ``count`` kernels that win most problems of each (pattern, layout) in the
    shipped database (ties by name), in that order: an A/B on what users run."""
    from collections import Counter

    from nmgen.db import connect, shipped_db, summary

    wins: dict[tuple, Counter] = {}
    for row in summary(connect(f"sqlite:///{shipped_db()}")):
        if row["best"]:
            wins.setdefault((row["pattern"], row["a_layout"]), Counter())[row["best"]] += 1
    return [name for family in sorted(wins)
            for name, _ in sorted(wins[family].items(), key=lambda kv: (-kv[1], kv[0]))[:count]]


def _compile(code: str) -> None:
    import cupy as cp

    cp.RawModule(code=code, options=NVRTC_OPTIONS, backend="nvrtc").compile()


def precompile(sources: list[KernelSource], workers: int = 16) -> None:
    """Fill CuPy's kernel cache with every variant, in parallel, before anything is timed."""
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        list(pool.map(_compile, [s.code for s in sources]))


def sass_listing(cubin: str, cuobjdump: str) -> list[str]:
    """A cubin's SASS instructions, in order (cuobjdump's text of each)."""
    listing = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True,
                             check=True).stdout
    return [m.group(1) for m in map(SASS_LINE.match, listing.splitlines()) if m]


def sass_counts(cubin: str, cuobjdump: str) -> tuple[int, int]:
    """(instructions, of them FFMA) in a cubin's SASS, counted statically."""
    ops = sass_listing(cubin, cuobjdump)
    return len(ops), sum(opcode(op) == "FFMA" for op in ops)


def nvcc_table(variants: list[tuple[str, str, KernelSource]], cuobjdump: str | None) -> None:
    """Print a fresh nvcc compile of each (configuration, variant, source): wall seconds
    (a throw-away cache, so nothing is reused), registers of the main kernel, and static
    SASS counts where ``cuobjdump`` is given."""
    print("| configuration | variant | nvcc s | registers | SASS instructions | FFMA |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for name, label, source in variants:
        with tempfile.TemporaryDirectory() as cache:
            os.environ["NMGEN_CACHE_DIR"] = cache
            start = time.perf_counter()
            compiled = compile_with_nvcc(source)
            seconds = time.perf_counter() - start
            total, ffma = (sass_counts(str(compiled.path), cuobjdump) if cuobjdump
                           else ("n/a", "n/a"))
        registers = compiled.resources[source.name].registers
        print(f"| {name} | {label} | {seconds:.2f} | {registers} | {total} | {ffma} |",
              flush=True)
