"""``nmgen.dispatch(a, b)``: run the best known kernel for this GPU, dtype, pattern and shape.

The families that serve the problem (``families.registry.serving``) are asked in turn;
for each, the lookup goes: the exact tuned shape → the nearest tuned shape of the same
GPU, pattern, vector length, dtype and layout → the same in another CUDA runtime's
records → the model's best configuration. Across families the record of the nearest shape
wins (so a family tuned for small M serves small M, one tuned for large M large M), and
where two families hold the same shape, the faster; the model's estimates come last. The
user's database comes first, then the one shipped with nmgen. A fallback is counted and
warned about once per problem. Decisions and compiled kernels are cached in the process,
so the steady-state cost of a call is a dictionary lookup and a launch.

``bias=`` and ``activation=`` ask for an epilogue (``nmgen.epilogue``): the decision's
configuration with it, or, where its family cannot take it, the next decision's in the
order above that can.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .epilogue import NO_EPILOGUE, Activation, Epilogue
from .families.base import Config, Family
from .families.registry import family_of, serving
from .format import NMMatrix
from .gpus import spec_or_h100, table_name
from .policy import best_per_problem
from .problem import ALayout, Problem
from .runtime.device import DeviceInfo, device_info, operand
from .runtime.launch import Kernel
from .shapes import shape_distance
from .store.database import connect, default_url, shipped_db
from .store.records import ProblemKey

# Where a decision comes from, best first: a record of this shape, of the nearest tuned
# shape, the same from another CUDA runtime's records, the family's model.
SOURCES = ("exact", "nearest", "exact-other-cuda", "nearest-other-cuda", "model")


@dataclass
class Decision:
    config: Config
    source: str  # one of SOURCES
    time_ms: float | None = None  # measured (exact, nearest) or estimated (model)
    distance: float = 0.0  # from the shape asked to the record's (inf: the model's)

    def rank(self) -> tuple:
        """Across families: the record of the nearest shape first (an exact one is at 0;
        families tuned at other M do not mislead one another), then the source, then
        the time (comparable where the shapes are the same), then the name."""
        return (self.distance, SOURCES.index(self.source), self.time_ms or 0.0,
                self.config.name)


class Dispatcher:
    """Holds the databases, the decision cache, the kernel cache and the counters.
    ``device``: the GPU decisions are made for (default: the current device)."""

    def __init__(self, db_urls: list[str] | None = None, device: DeviceInfo | None = None):
        self._urls = db_urls
        self._device = device
        self._engines: list[Any] | None = None
        self._decisions: dict[tuple, Decision] = {}
        self._ranked: dict[tuple, list[Decision]] = {}
        self._fast: dict[tuple, tuple[Kernel, str]] = {}
        self._kernels: dict[str, Kernel] = {}
        self._warned: set[tuple] = set()
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def _dbs(self) -> list[Any]:
        """The databases read, the user's first; dispatch never writes to them."""
        if self._engines is None:
            urls = self._urls
            if urls is None:
                urls = [u for u in (default_url(), f"sqlite:///{shipped_db()}")
                        if not u.startswith("sqlite:///") or Path(u[10:]).exists()]
            self._engines = [connect(u, writable=False) for u in urls]
        return self._engines

    def decide(self, problem: Problem, shape: tuple[int, int, int],
               epilogue: Epilogue = NO_EPILOGUE) -> Decision:
        """The kernel for ``problem`` at ``shape`` (M, N, K), with ``epilogue``."""
        key = (problem, shape, epilogue)
        cached = self._decisions.get(key)
        if cached is not None:
            return cached
        with self._lock:
            decision = self._with_epilogue(self._ranking(problem, shape), problem, epilogue)
            self._decisions[key] = decision
            return decision

    def _ranking(self, problem: Problem, shape: tuple[int, int, int]) -> list[Decision]:
        """Each serving family's decision, best first (``Decision.rank``)."""
        ranked = self._ranked.get((problem, shape))
        if ranked is None:
            ranked = self._ranked[(problem, shape)] = self._lookup(problem, shape)
        return ranked

    def _lookup(self, problem: Problem, shape: tuple[int, int, int]) -> list[Decision]:
        families = serving(problem)
        if not families:
            raise ValueError(f"no kernel family serves {problem}")
        found = [d for f in families if (d := self._lookup_family(f, problem, shape))]
        if not found:
            raise ValueError(f"no kernel of the families serving {problem} fits it "
                             f"({', '.join(f.name for f in families)})")
        return sorted(found, key=Decision.rank)

    @staticmethod
    def _with_epilogue(ranked: list[Decision], problem: Problem,
                       epilogue: Epilogue) -> Decision:
        """The best decision whose configuration takes ``epilogue``, with it."""
        if not epilogue:
            return ranked[0]
        for decision in ranked:
            config = family_of(decision.config).with_epilogue(decision.config, epilogue)
            if config is not None:
                return dataclasses.replace(decision, config=config)
        raise ValueError(f"no kernel family serving {problem} takes the epilogue "
                         f"{epilogue.tag!r} ({', '.join(d.config.family for d in ranked)})")

    @property
    def device(self) -> DeviceInfo:
        return self._device or device_info()

    def _lookup_family(self, family: Family, problem: Problem, shape: tuple[int, int, int]
                       ) -> Decision | None:
        key = problem_key(family, problem, shape, self.device)
        # Records of this CUDA runtime, then of another runtime of the same GPU and kernel
        # source (the compiler differs, the kernel does not): better than the model.
        for any_cuda, suffix in ((False, ""), (True, "-other-cuda")):
            for engine in self._dbs():
                winners = best_per_problem(engine, key, any_cuda=any_cuda)
                if shape in winners:
                    return Decision(winners[shape].config, "exact" + suffix,
                                    winners[shape].time_ms)
                if winners and family.tunes(shape):  # not stretched past its regime
                    nearest = min(winners.values(), key=lambda w: (
                        shape_distance(w.shape, shape), w.config.name))
                    return Decision(nearest.config, "nearest" + suffix, nearest.time_ms,
                                    shape_distance(nearest.shape, shape))
        gpu = spec_or_h100(key.gpu)
        config = family.default_config(problem, gpu, shape)
        if config is None:
            return None
        return Decision(config, "model", family.estimate_ms(config, gpu, shape), math.inf)

    def kernel(self, config: Config) -> Kernel:
        kernel = self._kernels.get(config.name)
        if kernel is None:
            with self._lock:
                kernel = self._kernels.setdefault(config.name, Kernel(config))
        return kernel

    def __call__(self, a: Any, b: NMMatrix, out: Any = None, *, bias: Any = None,
                 activation: Activation | str | None = None, stream: Any = None) -> Any:
        a_op = operand(a, "a")
        # Hot path: one dictionary lookup on what the decision depends on.
        fast = (a_op.device, a_op.shape, a_op.strides, a_op.dtype, b.n, b.m, b.vec, b.shape,
                b._values.dtype, bias is not None, activation)
        hit = self._fast.get(fast)
        if hit is None:
            hit = self._fast[fast] = self._choose(a_op, b, Epilogue.of(bias is not None,
                                                                        activation))
        kernel, source = hit
        with self._count_lock:  # Counter's += is a read-modify-write
            self.counts[source] += 1
        return kernel.run(a, a_op, b, out, stream, bias)

    def _choose(self, a_op: Any, b: NMMatrix, epilogue: Epilogue = NO_EPILOGUE
                ) -> tuple[Kernel, str]:
        if a_op.dtype is not b.dtype:
            raise TypeError(f"a is {a_op.dtype_name} but b holds {b.dtype.value} values: "
                            "pass activations in the weight's dtype")
        problem = Problem(b.n, b.m, b.vec, layout_of(a_op.shape, a_op.strides,
                                                     b.dtype.itemsize),
                          self.device.arch, b.dtype)
        shape = (a_op.shape[0], b.shape[1], b.shape[0])
        decision = self.decide(problem, shape, epilogue)
        if decision.source != "exact":
            self._warn_once(problem, shape, decision)
        return self.kernel(decision.config), decision.source

    def _warn_once(self, problem: Problem, shape: tuple[int, int, int],
                   decision: Decision) -> None:
        if problem in self._warned:
            return
        self._warned.add(problem)
        m, n, k = shape
        warnings.warn(f"nmgen.dispatch: no tuned record for "
                      f"{table_name(self.device.name)} {problem} M={m} "
                      f"N={n} K={k}; using the {decision.source} choice "
                      f"{decision.config.name} (said once; nmgen.dispatch_stats() counts "
                      "every fallback)", stacklevel=4)


def gpu_name() -> str:
    """The name the current device's records are keyed on."""
    return table_name(device_info().name)


def problem_key(family: Family, problem: Problem, shape: tuple[int, int, int],
                info: DeviceInfo) -> ProblemKey:
    """The database key of ``family``'s records of a problem on device ``info``."""
    return ProblemKey(gpu=table_name(info.name), device_name=info.name, arch=info.arch.value,
                      cuda_version=info.cuda_version, sms=info.sms,
                      template_hash=family.generator_hash(), n=problem.n, m=problem.m,
                      vec=problem.vec, dtype=problem.dtype.value,
                      a_layout=problem.a_layout.value, rows=shape[0], cols=shape[1],
                      depth=shape[2])


def layout_of(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> ALayout:
    """Row-major (K contiguous) or K-major (M contiguous) from byte strides."""
    if len(shape) != 2:
        raise ValueError(f"a must be 2-D (M×K), got shape {shape}")
    if shape[1] == 1 or strides[1] == itemsize:
        return ALayout.ROW_MAJOR
    if shape[0] == 1 or strides[0] == itemsize:
        return ALayout.K_MAJOR
    raise ValueError(f"a has strides {strides}: neither dimension is contiguous; "
                     "pass a row-major M×K array or a K-major view (a_kxm.T)")


_default: Dispatcher | None = None
_default_lock = threading.Lock()


def default_dispatcher() -> Dispatcher:
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Dispatcher()
    return _default


def dispatch(a: Any, b: NMMatrix, out: Any = None, *, bias: Any = None,
             activation: Activation | str | None = None, stream: Any = None) -> Any:
    """``activation(a @ b + bias)`` with the best known kernel, the bias (``N`` values in
    ``b``'s dtype) and the activation (``"relu"``, ``"gelu"``, ``"gelu_tanh"``, ``"silu"``)
    in its epilogue where given; see the module docstring."""
    return default_dispatcher()(a, b, out=out, bias=bias, activation=activation,
                                stream=stream)


def dispatch_stats() -> dict[str, int]:
    """How many calls were served from each source of ``SOURCES``: an exact record, a
    nearest shape, another CUDA runtime's records, the model."""
    return dict(default_dispatcher().counts)
