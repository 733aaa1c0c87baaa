"""Timing on the device (docs/design.md §4): CUDA events, warm-up, median of repeats, each
timed call queued behind a short wait on the GPU, and several callables timed in turns."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import numpy as np

from ..compiler.nvrtc import cupy
from .launch import wait_kernel

QUEUE_AHEAD_US = 100.0  # longer than a dispatch call's host path (~20-35 us)


def time_ms(fn: Callable[[int], object], warmup: int = 3, repeat: int = 20,
            queue_ahead_us: float = QUEUE_AHEAD_US, budget_ms: float = math.inf,
            min_repeat: int = 3) -> float:
    """Median milliseconds of ``fn(i)`` (``i`` lets the caller rotate inputs) on the device,
    timed with CUDA events on the current stream after ``warmup`` untimed calls. Each
    timed call is queued behind a ``queue_ahead_us`` wait on the GPU, so the host's cost
    of making the call stays out of the figure (0: no wait, host gaps included). Timing
    stops after ``repeat`` calls, or once ``min_repeat`` calls have taken ``budget_ms`` of
    GPU time (as Triton's ``do_bench`` sizes its repeats): long kernels vary little and a
    tuner times hundreds of them."""
    cp = cupy()
    for i in range(warmup):
        fn(i)
    stream = cp.cuda.get_current_stream()
    wait_ns = np.uint64(queue_ahead_us * 1000)
    times = []
    for i in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        if queue_ahead_us > 0:
            wait_kernel()((1,), (1,), (wait_ns,), stream=stream)
        start.record(stream)
        fn(i)
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
        if len(times) >= min_repeat and sum(times) >= budget_ms:
            break
    return statistics.median(times)


def time_in_turns(fns: dict[str, Callable[[int], object]], rounds: int = 3,
                  repeat: int = 10, warmup: int = 1,
                  queue_ahead_us: float = QUEUE_AHEAD_US) -> dict[str, float]:
    """Median milliseconds of each of ``fns``, timed ``rounds`` times in turns (``repeat``
    calls a turn), so that a drift of the clocks (a GPU still hot from the check's float64
    product, say) touches each alike instead of whichever was timed first."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(time_ms(fn, warmup=warmup, repeat=repeat,
                                         queue_ahead_us=queue_ahead_us))
    return {name: statistics.median(v) for name, v in samples.items()}
