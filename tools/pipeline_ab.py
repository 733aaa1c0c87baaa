"""Does the pipelined copy of row-major A pay on every problem it is used on?

For each (pattern, shape) whose tuned winner copies row-major A first (``tx``) and whose
launch the launcher pipelines (``nmgen.copy_plan`` gives more than one
chunk), times the winner in turns in one process two ways, each checked against float64
first (NaN-poisoned output):

  pipelined   the shipped launch: chunk j's copy overlaps chunk j-1's main kernel,
  one copy    ``Kernel.pipeline_copy = False``: one copy of all of A, then the main kernel,
  before      (--before) the launcher of the twenty-ninth to the thirty-second session
              (chunks on two streams of the greatest priority, which wait for the
              caller's stream first; tools/caller_stream_ab.py). Until the thirty-second
              session "before" was the pipeline shipped until the twenty-ninth (copies on
              a copy stream of their own, each main kernel waiting for its copy's event).

    python tools/pipeline_ab.py --shapes shapes/llama.txt --pattern 16:32,12:32,8:32,4:32 \\
        --db sqlite:///tuned_db/tuned.sqlite --out results/chunked_tx_h100/pipeline_ab.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nmgen.config import ALayout  # noqa: E402
from nmgen.copy_plan import PIPELINE_MIN_CHUNKS, PIPELINE_MIN_ROWS  # noqa: E402
from nmgen.dispatch import Dispatcher, problem_key  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import measure  # noqa: E402
from nmgen.gpu.bench import dense_float64, random_weight  # noqa: E402
from nmgen.gpu.launch import Kernel, _cupy, device_info, operand  # noqa: E402
from nmgen.gpu.timing import precompile, time_in_turns  # noqa: E402
from nmgen.report import geomean, markdown_table  # noqa: E402
from nmgen.shapes import read_shapes  # noqa: E402

RTOL = 1e-5


def one(config, shape, rounds: int, before: bool = False) -> dict | None:
    """The row of one problem, or None where its launch is not pipelined."""
    cp = _cupy()
    rows, cols, depth = shape
    piped, single = Kernel(config), Kernel(config)
    single.pipeline_copy = False
    a = cp.random.standard_normal((rows, depth), dtype=cp.float32)
    b = random_weight(config.n, config.m, config.vec, depth, cols)
    chunks = piped._cached_plan(b, operand(a, "a"), rows, depth).chunks
    if len(chunks) < 2:
        return None
    out = cp.full((rows, cols), cp.nan, cp.float32)
    ref = a.astype(cp.float64) @ dense_float64(b)
    fns = {"pipelined": lambda i: piped(a, b, out=out), "one copy": lambda i: single(a, b, out=out)}
    if before:
        from _ab import greatest_streams
        from in_stream_copy_ab import in_stream

        from nmgen.gpu.launch import COPY_1_DELAY_NS

        fns["before"] = in_stream(piped, a, b, out, greatest_streams(a.device.id),
                                  COPY_1_DELAY_NS)
    for name, fn in fns.items():
        err = measure.poisoned_error(lambda fn=fn: fn(0), out, ref)
        if not err < RTOL:
            raise RuntimeError(f"{config.name} {name} is wrong on {shape}: {err:.3g}")
    del ref
    ms = time_in_turns(fns, rounds=rounds, repeat=10)
    return {"chunks": "+".join(map(str, chunks)) if len(set(chunks)) > 1 else
            f"{len(chunks)}x{chunks[0]}", **ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=Path, required=True)
    parser.add_argument("--pattern", default="16:32,12:32,8:32,4:32")
    parser.add_argument("--vec", type=int, default=32)
    parser.add_argument("--db", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", action="store_true",
                        help="also the launcher of the twenty-ninth to the thirty-second session")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    dispatcher = Dispatcher(args.db)
    problems = []  # (pattern text, shape, tuned tx winner)
    for text in args.pattern.split(","):
        p = Pattern.parse(text)
        for shape in read_shapes(args.shapes):
            key = problem_key(p.n, p.m, args.vec, ALayout.ROW_MAJOR, *shape)
            config = dispatcher.decide(key).config
            if config.a_copied and shape[0] >= PIPELINE_MIN_CHUNKS * PIPELINE_MIN_ROWS:
                problems.append((text, shape, config))
    errors = precompile(list({c.name: c for _, _, c in problems}.values()), workers=16)
    if errors:
        raise RuntimeError("\n".join(errors))
    table, ratios = [], {}
    against = ["one copy", "before"] if args.before else ["one copy"]
    for text, shape, config in problems:
        row = one(config, shape, args.rounds, args.before)
        if row is None:
            continue
        for name in against:
            ratios.setdefault((text, name), []).append(row["pipelined"] / row[name])
        table.append([text, "x".join(map(str, shape)), row["chunks"],
                      *(f"{row[name]:.4f}" for name in ["pipelined", *against]),
                      *(f"{row['pipelined'] / row[name]:.3f}" for name in against), config.name])
        print(" | ".join(table[-1]), flush=True)
    summary = [[text, name, str(len(r)), f"{geomean(r):.3f}", f"{min(r):.3f}", f"{max(r):.3f}"]
               for (text, name), r in ratios.items()]
    lines = [f"# Pipelined copy against one copy ({device_info().name})", "",
             "pipelined time of each tuned `tx` winner the launcher pipelines, over the other"
             " versions':", "",
             markdown_table(["pattern", "over", "problems", "geomean", "min", "max"], summary),
             "", markdown_table(["pattern", "M x N x K", "chunks", "pipelined ms",
                                 *(f"{name} ms" for name in against),
                                 *(f"over {name}" for name in against), "kernel"], table)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
