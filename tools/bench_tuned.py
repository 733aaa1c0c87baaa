"""Tuned kernels (through ``dispatch``) against cuBLAS SGEMM, both timed in this process,
over a shapes file: per-shape speedup and the geometric mean per pattern.

    python tools/bench_tuned.py --shapes shapes/llama.txt --pattern 8:32 --out results/x
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nmgen  # noqa: E402
from nmgen.dispatch import Dispatcher  # noqa: E402
from nmgen.gpu.timing import time_ms  # noqa: E402
from nmgen.report import geomean, markdown_table  # noqa: E402
from nmgen.shapes import read_shapes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=Path, required=True)
    parser.add_argument("--pattern", default="8:32")
    parser.add_argument("--vec", type=int, default=32)
    parser.add_argument("--db", default=None, help="tuned database URL (default: shipped)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import cupy as cp

    from nmgen.db import shipped_db

    dispatcher = Dispatcher([args.db or f"sqlite:///{shipped_db()}"])
    rng = np.random.default_rng()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for pattern in args.pattern.split(","):
        for m_rows, n_cols, depth in read_shapes(args.shapes):
            w = rng.standard_normal((depth, n_cols), dtype=np.float32)
            b = nmgen.prune(w, pattern, args.vec)
            a = cp.asarray(rng.standard_normal((m_rows, depth), dtype=np.float32))
            w_dev = cp.asarray(w)
            out = cp.full((m_rows, n_cols), cp.nan, cp.float32)
            dispatcher(a, b, out=out)
            ref = nmgen.reference(a, b)
            err = float(cp.linalg.norm(out - ref) / cp.linalg.norm(ref))
            sgemm = time_ms(lambda i, a=a, w=w_dev: cp.matmul(a, w), repeat=args.repeat)
            ours = time_ms(lambda i, a=a, b=b, out=out: dispatcher(a, b, out=out),
                           repeat=args.repeat)
            key = dispatcher.key_for((m_rows, depth), nmgen.ALayout.ROW_MAJOR, b)
            decision = dispatcher.decide(key)
            rows.append({"pattern": pattern, "M": m_rows, "N": n_cols, "K": depth,
                         "sgemm_ms": sgemm, "nmgen_ms": ours, "speedup": sgemm / ours,
                         "tflops_dense_eq": 2 * m_rows * n_cols * depth / ours / 1e9,
                         "error": err, "source": decision.source,
                         "config": decision.config.name})
            print(f"{pattern} {m_rows}x{n_cols}x{depth}: {sgemm / ours:.2f}x "
                  f"({decision.source}) err {err:.1e}", flush=True)
            # Written after every shape: a run cut short still leaves its rows.
            (args.out / "bench_tuned.json").write_text(json.dumps(rows, indent=2))
    table_rows = []
    for pattern in args.pattern.split(","):
        sp = [r["speedup"] for r in rows if r["pattern"] == pattern]
        wrong = sum(not r["error"] < 1e-5 for r in rows if r["pattern"] == pattern)
        table_rows.append([pattern, len(sp), f"{geomean(sp):.2f}x", f"{min(sp):.2f}x",
                           f"{max(sp):.2f}x", wrong])
    text = markdown_table(["pattern", "shapes", "geomean speedup", "min", "max", "wrong"],
                          table_rows)
    (args.out / "bench_tuned.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
