"""The winners of several tuned databases timed again in one process, problem by problem,
on the same data, in turns: tuning runs are compared by their winners, not by the times
each run recorded on its own.

    python tools/retime_winners.py OUT.json LABEL=URL LABEL=URL ...
    e.g. python tools/retime_winners.py winners.json one=sqlite:///one.db two=sqlite:///two.db

The first database is the reference: for every problem it holds, each database's winner
is timed (``ROUNDS`` turns); ``geomean_<label>`` is the geometric mean over the problems
of the reference winner's time over that database's winner's (above 1: the other run's
winners are faster). Kernels compile through CuPy's cache (point ``CUPY_CACHE_DIR`` at
the runs' caches to reuse their compiles).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.bench.report import geomean  # noqa: E402
from nmgen.policy import best_per_problem  # noqa: E402
from nmgen.runtime.check import ProblemBench  # noqa: E402
from nmgen.runtime.launch import Kernel  # noqa: E402
from nmgen.runtime.timing import time_in_turns  # noqa: E402
from nmgen.store.database import connect  # noqa: E402
from nmgen.store.records import all_problems  # noqa: E402

ROUNDS = 5
BUDGET_MS = 100.0  # GPU time a problem's turns aim at


def retime(labelled_urls: list[tuple[str, str]]) -> dict:
    engines = {label: connect(url, writable=False) for label, url in labelled_urls}
    first = labelled_urls[0][0]
    rows = []
    for stored in all_problems(engines[first]):
        key, problem = stored.key, stored.key.problem
        winners = {label: best_per_problem(engine, key).get(key.shape)
                   for label, engine in engines.items()}
        if any(w is None for w in winners.values()):
            continue
        bench = ProblemBench(problem, *key.shape)
        configs = {w.config.name: w.config for w in winners.values()}
        slowest = max(w.time_ms for w in winners.values())
        repeat = max(3, min(20, int(BUDGET_MS / (ROUNDS * len(configs) * max(slowest, 1e-3)))))
        times = time_in_turns({name: bench.launcher(Kernel(c)) for name, c in configs.items()},
                              rounds=ROUNDS, repeat=repeat)
        rows.append({"shape": list(key.shape), "pattern": f"{key.n}:{key.m}", "vec": key.vec,
                     **{f"{label}_config": w.config.name for label, w in winners.items()},
                     **{f"{label}_ms": times[w.config.name] for label, w in winners.items()}})
        print(" ".join(f"{label} {times[w.config.name]:.4f} ms" for label, w in winners.items())
              + f"  {key.shape}", flush=True)
    summary = {f"geomean_{label}": geomean([r[f"{first}_ms"] / r[f"{label}_ms"] for r in rows])
               for label, _ in labelled_urls[1:]} if rows else {}
    return {"problems": len(rows), "reference": first, **summary, "rows": rows}


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, pairs = Path(sys.argv[1]), [a.split("=", 1) for a in sys.argv[2:]]
    if len(pairs) < 2 or any(len(p) != 2 for p in pairs):
        sys.exit(__doc__)
    result = retime([(label, url) for label, url in pairs])
    out.write_text(json.dumps(result, indent=1) + "\n")
    print({k: v for k, v in result.items() if k != "rows"})
    if not result["problems"] or any(not math.isfinite(v) for k, v in result.items()
                                     if k.startswith("geomean_")):
        sys.exit(1)


if __name__ == "__main__":
    main()
