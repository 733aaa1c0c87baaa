"""``nmgen selftest``: random cases of every registered family on the GPU against a float64
reference, many at once.

A case draws a problem the family serves (pattern, ``L``, A layout, dtype), a valid
configuration of the family's space that fits the GPU (half of them with a random epilogue:
a bias, an activation or both, where the family takes it), an odd shape (``M`` from 1,
``N`` and ``K`` not multiples of the tiles) and, for row-major A, sometimes a leading
dimension wider than ``K``; it poisons the output with NaN, runs the kernel on fresh random
data and compares with ``A64 @ B64`` of the rounded inputs (then the bias and the
activation, in float64). Configurations are drawn first and
compiled together in a process pool, then each serves several shapes, so that ten thousand
cases take minutes. A failing case is shrunk (smaller ``M``, ``N``, ``K`` while it still
fails) to a minimal one, kept as a regression that the GPU tests replay.

What a run checks follows from its seed alone: a family's configurations come from a
generator of (seed, family) (``family_configs``), each configuration's shapes and data
from one of (seed, configuration), so that the GPU tests compile every configuration ahead
(``tests/gpu_suite.py``) and split a family's configurations between processes
(``shard``) with the same cases as one process.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..compiler.nvrtc import cupy
from ..compiler.pool import CompilePool
from ..epilogue import Activation, Epilogue, apply_reference
from ..families.base import Config, Family, epilogue_of
from ..families.registry import all_families, config_from_name
from ..format import DType, NMMatrix
from ..gpus import Arch, spec_or_h100, table_name
from ..problem import ALayout, Problem
from ..runtime.check import device_array, random_weight, tolerance
from ..runtime.device import current_device, device_info
from ..runtime.launch import Kernel

PATTERNS = ((2, 4), (1, 4), (2, 8), (4, 8), (4, 16), (8, 16), (16, 32), (12, 32), (8, 32),
            (4, 32), (16, 64), (8, 64), (3, 7), (1, 1))
VECS = (1, 4, 8, 16, 32, 64, 128)
M_EDGES = (1, 2, 3, 17, 64, 255)
EPILOGUES = tuple(Epilogue(bias, act) for bias in (False, True) for act in Activation
                  if bias or act is not Activation.NONE)


@dataclass(frozen=True)
class Case:
    """One case, enough to run it again: configuration, shape, row stride pad, seed."""

    config: str
    rows: int
    cols: int
    depth: int
    lda_pad: int
    seed: int


@dataclass
class Outcome:
    """Cases run and wrong a family, and the minimal failing cases."""

    cases: dict[str, int] = field(default_factory=dict)
    wrong: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)

    def add(self, family: str, error: str | None, case: Case) -> None:
        self.cases[family] = self.cases.get(family, 0) + 1
        self.wrong.setdefault(family, 0)
        if error is not None:
            self.wrong[family] += 1


def draw_config(family: Family, rng: random.Random, arch: Any, gpu: Any) -> Config:
    """A random configuration of ``family`` that fits this GPU; half of them with a random
    epilogue (where the family takes one)."""
    if not serves_any(family, arch):
        raise ValueError(f"{family.name} serves no problem on {arch.value}: nothing to draw")
    dtypes = sorted(family.dtypes, key=lambda d: d.value)
    while True:
        n, m = rng.choice(PATTERNS)
        problem = Problem(n, m, rng.choice(VECS), rng.choice(list(ALayout)), arch,
                          rng.choice(dtypes))
        if family.serves(problem) is not None:
            continue
        try:
            config = family.space.sample(problem, rng, max_tries=300)
        except ValueError:  # nothing valid for this (pattern, L): draw again
            continue
        if family.feasible(config, gpu) is None:
            if rng.random() < 0.5:
                return family.with_epilogue(config, rng.choice(EPILOGUES)) or config
            return config


def serves_any(family: Family, arch: Any) -> bool:
    """Whether ``family`` serves some problem ``draw_config`` may draw on ``arch`` (a family
    of one arch serves none on another)."""
    return any(family.serves(Problem(n, m, vec, layout, arch, dtype)) is None
               for n, m in PATTERNS for vec in VECS for layout in ALayout
               for dtype in family.dtypes)


def fuzz_arch(family: Family, arch: Arch) -> Arch | None:
    """The arch whose problems ``family``'s cases are drawn for on a GPU of ``arch``: that
    one where the family serves it, else the newest older one it serves (a kernel built
    for an older arch runs on a newer GPU: ``mmasp`` on an H200); ``None``: none."""
    for candidate in sorted(Arch, key=lambda a: a.number, reverse=True):
        if candidate.number <= arch.number and serves_any(family, candidate):
            return candidate
    return None


def draw_shapes(rng: random.Random, count: int, max_size: int) -> Iterator[tuple[int, ...]]:
    """(M, N, K, lda pad): M edges first, then random odd sizes."""
    for i in range(count):
        rows = M_EDGES[i] if i < len(M_EDGES) and i < count // 2 else rng.randint(1, max_size)
        yield (rows, rng.randint(1, max_size), rng.randint(1, max_size),
               rng.choice((0, 0, 0, 3, 64)))


def run_case(kernel: Kernel, case: Case) -> float:
    """The case's error against float64, relative to the norm of the sum the epilogue's
    activation is applied to (bias included) where that is larger than the output's: the
    activations are 1-Lipschitz or near it, so the sum's rounding bounds what the output
    may be off by. Measured against the output's own norm alone, a GELU whose inputs are
    all far below zero (an output of 1e-20s, which FP32's 1 + erf rounds to zeros) reads as
    relative error 1 (``inf`` for an output left unwritten or not finite)."""
    cp = cupy()
    config = kernel.config
    rng = np.random.default_rng(case.seed)
    weight = random_weight(rng, config.n, config.m, config.vec, case.depth, case.cols,
                           dtype=config.dtype)
    a = _operand(rng, case, config.a_layout, config.dtype)
    out = cp.full((case.rows, case.cols), np.nan, np.float32)
    if config.dtype is not DType.F32:
        out = device_array(out, config.dtype)
    epilogue = epilogue_of(config)
    bias = None
    if epilogue.bias:
        bias = device_array(cp.asarray(rng.standard_normal(case.cols, dtype=np.float32)),
                            config.dtype)
    kernel(a, weight, out=out, bias=bias)
    got = _float64(out)
    ref = _float64(a) @ _dense64(weight)
    scale = float(cp.linalg.norm(ref))
    if epilogue:
        bias64 = None if bias is None else _float64(bias)
        scale = float(cp.linalg.norm(apply_reference(ref, bias64, None)))
        ref = apply_reference(ref, bias64, epilogue.activation)
    scale = max(scale, float(cp.linalg.norm(ref)), 1e-30)
    err = float(cp.linalg.norm(got - ref)) / scale
    return err if np.isfinite(err) else float("inf")


def _operand(rng: np.random.Generator, case: Case, layout: ALayout, dtype: DType) -> Any:
    """Logical M×K A in ``layout``; row-major with ``lda_pad`` more elements a row."""
    cp = cupy()
    if layout is ALayout.ROW_MAJOR:
        full = cp.asarray(rng.standard_normal((case.rows, case.depth + case.lda_pad),
                                              dtype=np.float32))
        return device_array(full, dtype)[:, :case.depth]
    return device_array(cp.asarray(rng.standard_normal((case.depth, case.rows),
                                                       dtype=np.float32)), dtype).T


def _float64(a: Any) -> Any:
    cp = cupy()
    if hasattr(a, "is_cuda"):
        return cp.asarray(a.double())
    return a.astype(cp.float64)


def _dense64(b: NMMatrix) -> Any:
    """``b`` as a dense float64 K×N array on the device."""
    cp = cupy()
    return cp.asarray(b.to_dense().astype(np.float64))


def shrink(case: Case, fails: Callable[[Case], bool]) -> Case:
    """A smaller case that still fails: each dimension halved while it does."""
    smaller = True
    while smaller:
        smaller = False
        for dim in ("rows", "cols", "depth"):
            size = getattr(case, dim)
            if size > 1:
                trial = Case(**{**asdict(case), dim: max(1, size // 2)})
                if fails(trial):
                    case, smaller = trial, True
    return case


def family_configs(family: Family, seed: int, cases: int, per_config: int, arch: Any,
                   gpu: Any) -> list[Config]:
    """The configurations ``selftest`` runs of ``family``: ``ceil(cases / per_config)``
    distinct ones, drawn by a generator of (seed, family) alone."""
    rng = random.Random(f"{seed}/{family.name}")
    configs: dict[str, Config] = {}
    while len(configs) < -(-cases // per_config):
        config = draw_config(family, rng, arch, gpu)
        configs[config.name] = config
    return list(configs.values())


def config_cases(config: Config, seed: int, count: int, max_size: int) -> list[Case]:
    """The ``count`` cases of ``config``: shapes and data seeds drawn by a generator of
    (seed, configuration)."""
    rng = random.Random(f"{seed}/{config.name}")
    return [Case(config.name, rows, cols, depth, pad, rng.randrange(1 << 31))
            for rows, cols, depth, pad in draw_shapes(rng, count, max_size)]


def selftest(cases: int, seed: int, per_config: int = 20, max_size: int = 384,
             families: list[Family] | None = None, workers: int = 16,
             log: Callable[[str], None] = print,
             advance: Callable[[int], None] = lambda n: None,
             shard: tuple[int, int] = (0, 1)) -> Outcome:
    """``cases`` random cases of each family (``families``: default every registered one),
    ``per_config`` a configuration. ``shard`` (i, n): only the i-th of every n
    configurations (n processes share a run; their cases add up to one process's).
    ``workers``: processes that compile the configurations first; 0: each is compiled here
    as it comes (or found in CuPy's cache, filled by another process)."""
    info = device_info()
    gpu = spec_or_h100(table_name(info.name))
    index, shards = shard
    outcome = Outcome()
    for family in families or all_families():
        arch = fuzz_arch(family, info.arch)
        if arch is None:
            log(f"{family.name}: serves no problem on {info.arch.value} or older")
            continue
        configs = family_configs(family, seed, cases, per_config, arch, gpu)
        counts = [min(per_config, cases - i * per_config) for i in range(len(configs))]
        mine = [(c, n) for i, (c, n) in enumerate(zip(configs, counts, strict=True))
                if i % shards == index]
        errors = {}
        if workers > 0:
            errors = dict(e.split(": ", 1) for e in _compile([c for c, _ in mine], workers))
            log(f"{family.name}: {len(mine)} configurations compiled, {len(errors)} failed")
        for config, count in mine:
            kernel = Kernel(config)
            error = errors.get(config.name) if workers > 0 else _compile_here(kernel)
            for case in config_cases(config, seed, count, max_size):
                wrong = check_case(kernel, case, error)
                outcome.add(family.name, wrong, case)
                if wrong is not None:
                    minimal = case if error is not None else shrink(
                        case, lambda c, k=kernel: check_case(k, c) is not None)
                    outcome.failures.append({**asdict(minimal), "family": family.name,
                                             "error": wrong})
                    log(f"WRONG {config.name} M={case.rows} N={case.cols} K={case.depth}: "
                        f"{wrong}; minimal M={minimal.rows} N={minimal.cols} "
                        f"K={minimal.depth}")
            advance(count)
            _drop_plans(kernel)
    return outcome


def check_case(kernel: Kernel, case: Case, compile_error: str | None = None) -> str | None:
    """``None`` when the case is right, else what is wrong."""
    if compile_error is not None:
        return f"compile error: {compile_error}"
    try:
        err = run_case(kernel, case)
    except Exception as exc:  # a launch that fails is a wrong case, not a crash
        return f"{type(exc).__name__}: {exc}"
    limit = tolerance(kernel.config.dtype)
    return None if err < limit else f"relative error {err:.3g} (limit {limit:g})"


def _compile_here(kernel: Kernel) -> str | None:
    """Compile (or load from CuPy's cache) ``kernel``'s entry points in this process;
    what failed, else ``None``."""
    try:
        for entry in kernel.family.entry_points(kernel.config):
            kernel._function(current_device(), entry, 0)
    except Exception as exc:  # reported as every case of it, as a pool's compile error is
        return f"{type(exc).__name__}: {exc}"
    return None


def _compile(configs: list[Config], workers: int) -> list[str]:
    with CompilePool(workers) as pool:
        return pool.compile(configs)


def _drop_plans(kernel: Kernel) -> None:
    """Free the compiled functions of a configuration done with (thousands are drawn)."""
    kernel._functions.clear()


def replay(failures: list[dict[str, Any]]) -> list[str]:
    """Run recorded minimal cases again; what is still wrong."""
    wrong = []
    for record in failures:
        config = config_from_name(record["config"])
        case = Case(**{k: record[k] for k in ("config", "rows", "cols", "depth", "lda_pad",
                                               "seed")})
        kernel = Kernel(config)
        error = check_case(kernel, case)
        if error is not None:
            wrong.append(f"{config.name} M={case.rows} N={case.cols} K={case.depth}: {error}")
    return wrong


def write(outcome: Outcome, path: Path, seed: int, cases: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"seed": seed, "cases_asked": cases, "cases": outcome.cases,
                                "wrong": outcome.wrong, "failures": outcome.failures},
                               indent=1) + "\n")
