"""The tuner replayed on the exhaustive tables (``tools/exhaustive.py``) with simulated
compile times, to tell a search that asks trials while others compile (the rolling tuner
of ``results/tune_speed_h100/rolling_tuner.patch``) from one that waits for each batch,
with the measurements held fixed. Each kernel's compile takes a time drawn from a
log-normal law seeded by its name (median 0.5 s, the core kernel four times that: the
compile times seen on the H100 host), scaled by ``--scale``; a tuner that waits for whole
batches never reads them.

    python tools/replay_rolling.py --trials 16,40 --seeds 0-4 --tables DIR   # host
    (cd ROLLING_TREE && python tools/replay_rolling.py ...)                  # the patch

DIR holds the ``8_32_km_full_slice*.jsonl`` tables of ``results/exhaustive_h100``.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.config import ALayout  # noqa: E402
from nmgen.model import gpu_spec  # noqa: E402
from nmgen.replay import ReplayMeasurer, ReplayTuner, read_tables, replay  # noqa: E402
from nmgen.report import markdown_table  # noqa: E402
from nmgen.shapes import read_shapes  # noqa: E402
from nmgen.space import core_config  # noqa: E402
from nmgen.tuner import UNSLICED_SPACE, TuneTask  # noqa: E402

COMPILE_MEDIAN_S = 0.5
COMPILE_SIGMA = 0.6
CORE_FACTOR = 4.0


def compile_seconds(name: str, core: str | None, scale: float) -> float:
    rng = random.Random(hashlib.sha256(name.encode()).digest())
    seconds = rng.lognormvariate(math.log(COMPILE_MEDIAN_S), COMPILE_SIGMA)
    return scale * seconds * (CORE_FACTOR if name == core else 1.0)


class SlowCompileMeasurer(ReplayMeasurer):
    """A replayed table whose kernels take time to compile (read only by a tuner that
    submits kernels one by one)."""

    def __init__(self, task, table, device, pool, scale):
        super().__init__(task, table, device)
        core = core_config(task.problem)
        self._core = core.name if core else None
        self._pool, self._scale = pool, scale

    def submit(self, config):
        if isinstance(config, list):  # main's tuner submits whole batches: not simulated
            return super().submit(config)
        return self._pool.submit(time.sleep, compile_seconds(config.name, self._core,
                                                             self._scale))


def slow_compile_tuner(pool, scale: float) -> type[ReplayTuner]:
    class SlowCompileTuner(ReplayTuner):
        def measurer(self, task):
            table = self.tables[(task.rows, task.cols, task.depth)]
            return SlowCompileMeasurer(task, table, self.device, pool, scale)

    return SlowCompileTuner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=Path, default=Path("results/exhaustive_h100"))
    parser.add_argument("--shapes", default="shapes/exhaustive.txt")
    parser.add_argument("--trials", default="16,40")
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--scale", type=float, default=1.0, help="compile times x this")
    args = parser.parse_args()
    tables = read_tables(sorted(args.tables.glob("8_32_km_full_slice*.jsonl")))
    first, last = (int(s) for s in args.seeds.split("-"))
    tasks = [TuneTask(gpu_spec("h100"), 8, 32, 32, ALayout.K_MAJOR, *shape,
                      space=UNSLICED_SPACE) for shape in read_shapes(args.shapes)]
    rows = []
    with ThreadPoolExecutor(8) as pool:
        tuner = slow_compile_tuner(pool, args.scale)
        for trials in (int(t) for t in args.trials.split(",")):
            for task in tasks:
                results = replay([task], tables, trials, range(first, last + 1),
                                 tuner_class=tuner)
                gaps, seconds = [], []
                while True:  # timed one seed at a time
                    start = time.monotonic()
                    result = next(results, None)
                    if result is None:
                        break
                    gaps.append(100 * result.gap)
                    seconds.append(time.monotonic() - start)
                rows.append([f"{task.rows}x{task.cols}x{task.depth}", trials,
                             f"{statistics.median(gaps):.2f} %", f"{max(gaps):.2f} %",
                             " ".join(f"{g:.2f}" for g in gaps),
                             f"{statistics.mean(seconds):.1f} s"])
    print(markdown_table(["shape", "trials", "gap (median)", "worst", "gap by seed, %",
                          "study wall time (mean)"], rows))


if __name__ == "__main__":
    main()
