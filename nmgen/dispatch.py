"""``nmgen.dispatch(a, b)``: run the best known kernel for this GPU, pattern and shape.

Lookup order: the exact tuned shape → the nearest tuned shape of the same GPU, pattern,
vector length, dtype and layout → the model's best feasible configuration. The user's
database comes first, then the one shipped in ``tuned_db/``. A fallback is counted and
warned about once per (GPU, pattern, layout). Decisions and compiled kernels are cached
in the process, so the steady-state cost of a call is a dictionary lookup and a launch.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from .codegen import generator_text
from .config import ALayout, Family, KernelConfig
from .db import ProblemKey, best_per_problem, connect, shipped_db
from .format import NMMatrix
from .gpu.launch import Kernel, device_info, operand
from .model import GPUS, default_layout_tile, gpu_of_device_name, gpu_spec, rank
from .shapes import shape_distance
from .space import Problem, enumerate_configs


@functools.cache
def template_hash(family: Family = Family.F32_SIMT) -> str:
    """The records' generator key: the template and the code generator (see
    ``codegen.generator_text``)."""
    return hashlib.sha256(generator_text(family).encode()).hexdigest()


@dataclass
class Decision:
    config: KernelConfig
    source: str  # "exact", "nearest" or "model"


class Dispatcher:
    """Holds the databases, the decision cache, the kernel cache and the counters."""

    def __init__(self, db_urls: list[str] | None = None):
        self._urls = db_urls
        self._engines: list[Any] | None = None
        self._decisions: dict[ProblemKey, Decision] = {}
        self._fast: dict[tuple, tuple[Kernel, str]] = {}
        self._kernels: dict[str, Kernel] = {}
        self._warned: set[tuple] = set()
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def _dbs(self) -> list[Any]:
        if self._engines is None:
            urls = self._urls
            if urls is None:
                urls = [None]
                if shipped_db().exists():  # read-only use: never written by dispatch
                    urls.append(f"sqlite:///{shipped_db()}")
            self._engines = [connect(u) for u in urls]
        return self._engines

    def key_for(self, a_shape: tuple[int, int], a_layout: ALayout, b: NMMatrix) -> ProblemKey:
        return problem_key(b.n, b.m, b.vec, a_layout, a_shape[0], b.shape[1], b.shape[0])

    def decide(self, key: ProblemKey) -> Decision:
        cached = self._decisions.get(key)
        if cached is not None:
            return cached
        with self._lock:
            decision = self._lookup(key)
            self._decisions[key] = decision
            return decision

    def _lookup(self, key: ProblemKey) -> Decision:
        shape = (key.rows, key.cols, key.depth)
        for engine in self._dbs():
            winners = best_per_problem(engine, key)
            if shape in winners:
                return Decision(winners[shape].config, "exact")
            if winners:
                nearest = min(winners.values(), key=lambda w: (shape_distance(w.shape, shape),
                                                               w.config.name))
                return Decision(nearest.config, "nearest")
        return Decision(model_choice(key), "model")

    def kernel(self, config: KernelConfig) -> Kernel:
        kernel = self._kernels.get(config.name)
        if kernel is None:
            with self._lock:
                kernel = self._kernels.setdefault(config.name, Kernel(config))
        return kernel

    def __call__(self, a: Any, b: NMMatrix, out: Any = None, *, stream: Any = None) -> Any:
        a_op = operand(a, "a")
        # Hot path: one dictionary lookup on what the decision depends on.
        fast = (a_op.device, a_op.shape, a_op.strides, b.n, b.m, b.vec, b.shape)
        hit = self._fast.get(fast)
        if hit is None:
            layout = layout_of(a_op.shape, a_op.strides)
            key = self.key_for(a_op.shape, layout, b)
            decision = self.decide(key)
            if decision.source != "exact":
                self._warn_once(key, decision)
            hit = self._fast[fast] = (self.kernel(decision.config), decision.source)
        kernel, source = hit
        with self._count_lock:  # Counter's += is a read-modify-write
            self.counts[source] += 1
        return kernel.run(a, a_op, b, out, stream)

    def _warn_once(self, key: ProblemKey, decision: Decision) -> None:
        family = key.same_family()
        if family in self._warned:
            return
        self._warned.add(family)
        warnings.warn(f"nmgen.dispatch: no tuned record for {key.gpu} {key.n}:{key.m} "
                      f"L={key.vec} {key.a_layout} M={key.rows} N={key.cols} K={key.depth}; "
                      f"using the {decision.source} choice {decision.config.name} (said once; "
                      "nmgen.dispatch_stats() counts every fallback)", stacklevel=3)


def problem_key(n: int, m: int, vec: int, a_layout: ALayout, rows: int, cols: int,
                depth: int) -> ProblemKey:
    """The database key of a problem on the current device."""
    info = device_info()
    gpu = gpu_of_device_name(info.name) or info.name.lower().replace(" ", "_")
    return ProblemKey(gpu=gpu, device_name=info.name, arch=info.arch.value,
                      cuda_version=info.cuda_version, sms=info.sms,
                      template_hash=template_hash(), n=n, m=m, vec=vec, dtype="f32",
                      a_layout=a_layout.value, rows=rows, cols=cols, depth=depth)


def model_choice(key: ProblemKey) -> KernelConfig:
    """The model's best feasible configuration for ``key`` (no database needed)."""
    # An unknown GPU: the H100 entry stands in for the model's figures.
    spec = GPUS[key.gpu] if key.gpu in GPUS else replace(gpu_spec("h100"), name=key.gpu)
    layout = ALayout(key.a_layout)
    problem = Problem(key.n, key.m, key.vec, a_layout=layout, arch=spec.arch)
    candidates = [c for c in enumerate_configs(problem)
                  if c.a_tile is default_layout_tile(layout) or layout is ALayout.K_MAJOR]
    ranked = rank(candidates, spec, key.rows, key.cols, key.depth)
    if not ranked:
        raise RuntimeError(f"no feasible configuration for {key}")
    return ranked[0][1]


def layout_of(shape: tuple[int, ...], strides: tuple[int, ...]) -> ALayout:
    """Row-major (K contiguous) or K-major (M contiguous) from byte strides."""
    if len(shape) != 2:
        raise ValueError(f"a must be 2-D (M×K), got shape {shape}")
    item = 4
    if shape[1] == 1 or strides[1] == item:
        return ALayout.ROW_MAJOR
    if shape[0] == 1 or strides[0] == item:
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


def dispatch(a: Any, b: NMMatrix, out: Any = None, *, stream: Any = None) -> Any:
    """``a @ b`` with the best known kernel; see the module docstring."""
    return default_dispatcher()(a, b, out=out, stream=stream)


def dispatch_stats() -> dict[str, int]:
    """How many calls were served from an exact record, a nearest shape or the model."""
    return dict(default_dispatcher().counts)
