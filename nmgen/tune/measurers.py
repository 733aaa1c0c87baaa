"""Measurers: what a trial's configuration measures as. On the GPU (compiled in the pool,
checked against float64, timed with CUDA events), the analytic model's estimate (the dry
run), or a recorded table (``replay``)."""

from __future__ import annotations

import functools
import time
from typing import Any

from ..families.base import Config
from ..store.records import ProblemKey
from ..store.tables import TrialStatus
from .task import TuneTask

INFEASIBLE_MS = 1e9  # value told to Optuna for a violated constraint
# GPU time a trial's timing aims at: 15 calls of a short kernel, 3 of a 20 ms one (the
# finalists are timed again anyway); timing took 104-182 s of 361 s a pattern on the H100,
# most of it on the largest shapes.
TRIAL_BUDGET_MS = 50.0

# A measurer's measure(config, model_ms) -> (status, value told to Optuna, error text);
# model_ms is the analytic estimate, which the dry run reports as its measurement.
Outcome = tuple[str, float, "str | None"]


class Compiled:
    """A batch with nothing to compile (the dry run's, a replay's)."""

    def done(self) -> bool:
        return True

    def errors(self) -> list[str]:
        return []


class Measurer:
    """What the tuner asks of a measurer, less ``measure`` and ``retime``: by default
    there is nothing to compile. ``submit`` starts a batch's compiles and returns what
    ``done()`` says when they are over; ``take`` waits for them."""

    key: ProblemKey

    def submit(self, configs: list[Config]) -> Any:
        return Compiled()

    def take(self, batch: Any) -> None:
        pass

    def prepare(self, configs: list[Config]) -> None:
        """Compile ``configs`` before they are measured outside a batch."""
        self.take(self.submit(configs))


class GpuMeasurer(Measurer):
    """Compile a batch in the process pool, then check each kernel against float64 once
    and time it with CUDA events on this process's GPU."""

    def __init__(self, task: TuneTask, pool: Any):
        self.key = self.key_of(task)
        self._task = task
        self._pool = pool
        self._errors: dict[str, str] = {}
        self.data_s = 0.0  # making the problem's data (part of the first measurement)

    @functools.cached_property
    def _bench(self):
        """The problem's data on the device, made at the first measurement (a study that
        other workers already filled needs none)."""
        from ..runtime.check import ProblemBench

        t = self._task
        start = time.monotonic()
        bench = ProblemBench(t.problem, t.rows, t.cols, t.depth)
        self.data_s = time.monotonic() - start
        return bench

    @staticmethod
    def key_of(task: TuneTask) -> ProblemKey:
        from ..runtime.device import device_info

        info = device_info()
        return task.key(info.name, info.cuda_version)

    def submit(self, configs: list[Config]) -> Any:
        """Start compiling ``configs``: a ``CompileBatch``."""
        return self._pool.submit(configs)

    def take(self, batch: Any) -> None:
        """Wait for ``batch``; its compile errors are the measurements of those kernels."""
        self._errors = dict(e.split(": ", 1) for e in batch.errors())

    def measure(self, config: Config, model_ms: float) -> Outcome:
        from ..runtime.check import tolerance
        from ..runtime.launch import Kernel

        if config.name in self._errors:
            return TrialStatus.COMPILE_ERROR, INFEASIBLE_MS, self._errors[config.name]
        try:
            kernel = Kernel(config)
            err = self._bench.error(kernel)
            if not err < tolerance(self._task.problem.dtype):
                return TrialStatus.WRONG, INFEASIBLE_MS, f"relative error {err:.3g}"
            return TrialStatus.OK, self._bench.time_ms(kernel, budget_ms=TRIAL_BUDGET_MS), None
        except Exception as exc:  # a kernel that fails to launch is a result, not a crash
            return TrialStatus.LAUNCH_ERROR, INFEASIBLE_MS, f"{type(exc).__name__}: {exc}"

    def retime(self, configs: list[Config], rounds: int, repeat: int
               ) -> dict[str, float]:
        """Median of ``rounds`` timings (``repeat`` calls each) of each (already checked)
        configuration, taken in turns so that a drift of the clocks touches all alike."""
        from ..runtime.launch import Kernel
        from ..runtime.timing import time_in_turns

        return time_in_turns({c.name: self._bench.launcher(Kernel(c)) for c in configs},
                             rounds=rounds, repeat=repeat)


class ModelMeasurer(Measurer):
    """The dry run's stand-in: the analytic model's time, no GPU. Recorded with status
    ``model`` under a GPU row of its own, so dispatch never takes it for a measurement."""

    def __init__(self, task: TuneTask):
        self.key = task.key(f"model:{task.gpu.name}", 0)
        self._task = task

    def measure(self, config: Config, model_ms: float) -> Outcome:
        return TrialStatus.MODEL, model_ms, None

    def retime(self, configs: list[Config], rounds: int, repeat: int
               ) -> dict[str, float]:
        """The model gives the same estimate every time."""
        t = self._task
        return {c.name: t.family.estimate_ms(c, t.gpu, t.shape) for c in configs}
