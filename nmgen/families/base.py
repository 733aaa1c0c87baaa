"""The kernel-family interface: everything the tuner, the store, dispatch, the runtime, the
bench, export and the CLI may ask of a family. They never name a family's parameters.

A family owns its template(s), its configuration class (name, rules, JSON), its search
space (declared once), its resource rules, its analytic model, its one-time weight
preparation and its launch plan. Families register in ``nmgen.families.registry``.

``ModularFamily`` is the convention the built-in families follow: a family is a folder of
conventionally named modules, which the base class finds; the cached enumeration of a
space (``enumeration``) and the model's table of it (``rank_table``) are built here for
every family alike.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Protocol, overload

import numpy as np

from ..cache import cache_file, load_or_build
from ..epilogue import NO_EPILOGUE, Epilogue
from ..format import DType, NMMatrix
from ..gpus import Arch, GpuSpec
from ..problem import ALayout, Problem
from ..shapes import Shape
from .plan import Call, Device, LaunchPlan
from .space import ConfigError, SearchSpace

# Templates every family's template may include (beside its own folder): the epilogue, and
# the transpose of row-major A (the tensor-core families).
SHARED_TEMPLATES = Path(__file__).resolve().parent / "templates"
EPILOGUE_TEMPLATE = SHARED_TEMPLATES / "epilogue.cuh.j2"
TRANSPOSE_TEMPLATE = SHARED_TEMPLATES / "transpose.cuh.j2"
DEVICE_TEMPLATE = SHARED_TEMPLATES / "device.cuh.j2"


class Config(Protocol):
    """What every family's configuration offers (a frozen dataclass in practice)."""

    family: ClassVar[str]
    n: int
    m: int
    vec: int
    a_layout: ALayout
    arch: Arch

    @property
    def name(self) -> str:
        """The kernel's name, stating every parameter."""

    @property
    def dtype(self) -> DType: ...

    def to_dict(self) -> dict[str, Any]: ...

    def to_json(self) -> str: ...


def epilogue_of(config: Config) -> Epilogue:
    """What ``config`` does to its output beyond the product (``Family.with_epilogue``)."""
    return getattr(config, "epilogue", NO_EPILOGUE)


@dataclass(frozen=True)
class PreparedWeight:
    """A weight's kernel-side layout on the host: arrays by name (the plan's buffers).
    ``key``: what it depends on; configurations of one key share it."""

    key: Any
    arrays: dict[str, np.ndarray]
    seconds: float = 0.0  # host time spent preparing

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def check_weight(b: NMMatrix, config: Config) -> None:
    """Raise ``ValueError`` where ``b`` is not a weight ``config`` runs: its pattern, ``L``
    and dtype (a family's ``prepare`` first)."""
    if (config.n, config.m, config.vec) != (b.n, b.m, b.vec):
        raise ValueError(f"kernel {config.name} is for {config.n}:{config.m} L={config.vec}; "
                         f"the weight is {b.pattern} L={b.vec}")
    if b.dtype is not config.dtype:
        raise ValueError(f"kernel {config.name} takes {config.dtype.value} values; the weight "
                         f"holds {b.dtype.value}")


class Ranked(Sequence[tuple[float, Any]]):
    """(predicted ms, configuration) pairs in ranked order, each pair built when read: a
    ranking of a whole space (tens of thousands of configurations) is mostly asked for
    its first few, and building every pair cost more than the ranking."""

    def __init__(self, times: np.ndarray, order: np.ndarray, configs: Sequence[Any]):
        self._times, self._order, self._configs = times, order, configs

    def __len__(self) -> int:
        return len(self._order)

    @overload
    def __getitem__(self, index: int) -> tuple[float, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[float, Any]]: ...

    def __getitem__(self, index: int | slice) -> tuple[float, Any] | list[tuple[float, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        j = int(self._order[index])
        return float(self._times[j]), self._configs[j]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


class Ranker(Protocol):
    """Feasible configurations ranked by the model for any shape (built once a space)."""

    configs: Sequence[Any]

    def rank(self, rows: int, cols: int, depth: int) -> Sequence[tuple[float, Any]]:
        """(predicted ms, configuration), fastest first, ties by name."""


class Family(ABC):
    """A kernel family. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str]  # as records, studies and kernel names hold it, e.g. "f32"
    title: ClassVar[str]  # for people, e.g. "FP32 SIMT (CUDA cores)"
    dtypes: ClassVar[frozenset[DType]]
    space: SearchSpace
    # Named subspaces of ``space`` (for comparisons that must enumerate one)
    subspaces: dict[str, SearchSpace] = {}
    # Whether the calibration's corrections may change with the vector length L
    # (``nmgen.calibration``): where L changes what a configuration's tile does
    calibrate_by_vec: ClassVar[bool] = False
    # The method whose list of configurations the untuned choice ranks (``default_config``)
    untuned_candidates: ClassVar[str] = "seed_candidates"

    # ------------------------------------------------------------ serving
    def serves(self, problem: Problem) -> str | None:
        """``None`` where the family can run ``problem``; otherwise why not."""
        if problem.dtype not in self.dtypes:
            return f"{self.name} kernels take {', '.join(sorted(d.value for d in self.dtypes))}"
        return None

    def tunes(self, shape: tuple[int, int, int]) -> bool:
        """Whether a tune that names no family spends trials on this family at ``shape``
        (M, N, K): a family built for one regime says where it cannot win. Dispatch runs
        its exact records anywhere but its nearest ones only here (a decode record is no
        guide to a prefill shape)."""
        return True

    # ------------------------------------------------------------ configuration
    @abstractmethod
    def config_from_dict(self, values: dict[str, Any]) -> Config:
        """A configuration from its JSON form (``Config.to_dict``)."""

    @abstractmethod
    def config_from_name(self, name: str) -> Config | None:
        """The configuration a kernel name states; ``None`` for another family's name."""

    def with_epilogue(self, config: Config, epilogue: Epilogue) -> Config | None:
        """``config`` adding a bias and applying an activation to its FP32 sums before
        their one rounding (``nmgen.epilogue``), or ``None`` where it cannot. Records are
        tuned without an epilogue; this is how a tuned configuration takes one. By
        default: a configuration with an ``epilogue`` field takes any."""
        if not dataclasses.is_dataclass(config) or "epilogue" not in {
                f.name for f in dataclasses.fields(config)}:
            return None
        try:
            return dataclasses.replace(config, epilogue=epilogue)
        except ConfigError:
            return None

    def compile_target(self, config: Config) -> str:
        """The target its source compiles for (``-arch``): the configuration's arch, or an
        arch-specific one (``sm_90a``) where the kernel uses instructions only it has."""
        return config.arch.value

    # ------------------------------------------------------------ resources and model
    @abstractmethod
    def feasible(self, config: Config, gpu: GpuSpec) -> str | None:
        """``None`` where ``config`` runs on ``gpu``; otherwise why not."""

    @abstractmethod
    def estimate_ms(self, config: Config, gpu: GpuSpec, shape: Shape) -> float:
        """The analytic model's time of ``config`` on ``shape`` (M, N, K)."""

    @abstractmethod
    def ranker(self, configs: Sequence[Config], gpu: GpuSpec) -> Ranker:
        """The feasible ones of ``configs`` ranked by the model, for any shape."""

    def seed_candidates(self, problem: Problem, space: SearchSpace) -> list[Config]:
        """What the model ranks for a study's first guesses and the untuned choice: the
        space's enumeration (``enumeration``: cached)."""
        return list(enumeration(self, problem, space))

    def seed_shape(self, config: Config) -> tuple:
        """What two of a study's model seeds must differ in (the tuner takes the model's
        best configuration of each, for diverse first guesses)."""
        return tuple(self.space.values_of(config).items())

    def seed_variants(self, best: Config, space: SearchSpace) -> list[Config]:
        """Variants of the model's best guess outside the enumeration (e.g. split-K)
        that the tuner ranks beside it."""
        return []

    def refinements(self, config: Config) -> list[Config]:
        """Variants of a tuned winner that a search does not reach on its own, timed by
        ``nmgen refine`` where the model expects them faster."""
        return []

    def reference_config(self, problem: Problem) -> Config | None:
        """A hand-picked kernel no tuned shape may fall below: timed on every shape, and
        the winner where it is within a tie of the fastest (``nmgen.policy``)."""
        return None

    def default_config(self, problem: Problem, gpu: GpuSpec, shape: Shape) -> Config | None:
        """The model's choice for an untuned problem: the best of ``untuned_candidates``."""
        ranked = model_ranking(self, problem, gpu, shape, self.untuned_candidates)
        return ranked[0][1] if ranked else None

    def adapt(self, config: Config, problem: Problem) -> Config | None:
        """``config`` (tuned for another pattern or vector length of the same dtype and A
        layout) made for ``problem``, or ``None`` where no such kernel is valid and in the
        family's space for it. First the same configuration with the problem's ``n``,
        ``m`` and ``vec``; where that breaks a rule or leaves the space, the same space
        values built for ``problem`` (sizes the space states per pattern then follow it)."""
        values = config.to_dict()
        values.update(n=problem.n, m=problem.m, vec=problem.vec)
        try:
            adapted = self.config_from_dict(values)
        except (ValueError, TypeError):
            adapted = None
        if adapted is not None and self.in_space(adapted, problem):
            return adapted
        rebuilt = self.space.config(problem, self.space.values_of(config))
        return rebuilt if rebuilt is not None and self.in_space(rebuilt, problem) else None

    def in_space(self, config: Config, problem: Problem) -> bool:
        """Whether ``config`` serves ``problem`` and is one the family's space offers it."""
        if (config.n, config.m, config.vec, config.a_layout, config.dtype) != (
                problem.n, problem.m, problem.vec, problem.a_layout, problem.dtype):
            return False
        allowed = self.space.choices(problem)
        return all(v in allowed[name] for name, v in self.space.values_of(config).items())

    # ------------------------------------------------------------ code generation
    @property
    @abstractmethod
    def templates(self) -> Path:
        """The folder of the family's Jinja2 templates."""

    @abstractmethod
    def template_name(self, config: Config) -> str:
        """The template that renders ``config``."""

    @abstractmethod
    def template_arguments(self, config: Config) -> dict[str, Any]:
        """What the template reads beside ``c`` (the configuration), ``name`` and
        ``version``."""

    @abstractmethod
    def entry_points(self, config: Config) -> tuple[str, ...]:
        """The kernels the source defines, the main one first."""

    @abstractmethod
    def generator_files(self) -> tuple[Path, ...]:
        """The files that turn a configuration into source (templates and the module of
        ``template_arguments``): tuned records are keyed on their hash."""

    def source_files(self) -> tuple[Path, ...]:
        """The Python files of the family's package and of what it builds on (its space,
        model and rules): results derived from them alone are cached on disk under their
        hash (``nmgen.cache``)."""
        here = Path(inspect.getfile(type(self))).resolve().parent
        package = here.parent.parent
        shared = (package / "families" / "space.py", package / "format.py",
                  package / "gpus.py", package / "problem.py")
        return tuple(sorted(here.glob("*.py"))) + tuple(p for p in shared if p.exists())

    def generator_hash(self) -> str:
        digest = hashlib.sha256()
        for path in self.generator_files():
            digest.update(path.read_bytes())
        return digest.hexdigest()

    # ------------------------------------------------------------ weight and launch
    @abstractmethod
    def prepare(self, weight: NMMatrix, config: Config) -> PreparedWeight:
        """The weight's kernel-side layout for ``config`` (made once, on the host)."""

    @abstractmethod
    def layout_key(self, config: Config) -> Any:
        """What ``prepare`` depends on of ``config`` (configurations of one key share one
        prepared layout)."""

    @abstractmethod
    def plan(self, config: Config, weight: PreparedWeight, shape: tuple[int, int],
             call: Call, device: Device) -> LaunchPlan:
        """The launches of one call: ``shape`` is the weight's (K, N)."""


class ModularFamily(Family):
    """A family that is a folder of conventionally named modules, which this class finds
    in the family's package and answers the interface from:

    - ``model``: ``feasible(config, gpu)``, ``estimate_ms(config, gpu, shape)`` and
      ``rank_table(configs, gpu)`` (a ``Ranker``);
    - ``render``: ``TEMPLATE`` (in ``templates/``), ``template_arguments(config)`` and
      ``entry_points(config)``;
    - ``prepare``: ``prepare(weight, config)`` and ``layout_key(config)``;
    - ``launch``: ``plan(config, weight, shape, call, device)``;
    - ``config`` and ``space``, whose configuration class (``config_type``) and space
      the subclass names.

    A module the package lacks is taken from ``base_package`` where the subclass names
    one (the tensor-core families share a weight layout and launch plan). The family's
    generator is its template, ``shared_templates`` and its ``render.py``."""

    config_type: ClassVar[type]
    base_package: ClassVar[str | None] = None
    shared_templates: ClassVar[tuple[Path, ...]] = (EPILOGUE_TEMPLATE,)

    @property
    def folder(self) -> Path:
        """The family's package."""
        return Path(inspect.getfile(type(self))).resolve().parent

    def module(self, name: str) -> ModuleType:
        """The family's module ``name`` (else ``base_package``'s)."""
        return _module_of(type(self), name)

    @property
    def name_prefix(self) -> str:
        """How the family's kernel names begin."""
        return f"nm_{self.name}_"

    # ------------------------------------------------------------ configuration
    def config_from_dict(self, values: dict[str, Any]) -> Config:
        return self.config_type.from_dict(values)

    def config_from_name(self, name: str) -> Config | None:
        if not name.startswith(self.name_prefix):
            return None
        return self.config_type.from_name(name)

    # ------------------------------------------------------------ resources and model
    def feasible(self, config: Config, gpu: GpuSpec) -> str | None:
        return self.module("model").feasible(config, gpu)

    def estimate_ms(self, config: Config, gpu: GpuSpec, shape: Shape) -> float:
        return self.module("model").estimate_ms(config, gpu, shape)

    def ranker(self, configs: Sequence[Config], gpu: GpuSpec) -> Ranker:
        return self.module("model").rank_table(configs, gpu)

    # ------------------------------------------------------------ code generation
    @property
    def templates(self) -> Path:
        return self.folder / "templates"

    def template_name(self, config: Config) -> str:
        return self.module("render").TEMPLATE

    def template_arguments(self, config: Config) -> dict[str, Any]:
        return self.module("render").template_arguments(config)

    def entry_points(self, config: Config) -> tuple[str, ...]:
        return self.module("render").entry_points(config)

    def generator_files(self) -> tuple[Path, ...]:
        return (self.templates / self.module("render").TEMPLATE, *self.shared_templates,
                self.folder / "render.py")

    def source_files(self) -> tuple[Path, ...]:
        if self.base_package is None:
            return super().source_files()
        shared = Path(importlib.import_module(self.base_package).__file__).resolve().parent
        return super().source_files() + tuple(sorted(shared.glob("*.py")))

    # ------------------------------------------------------------ weight and launch
    def prepare(self, weight: NMMatrix, config: Config) -> PreparedWeight:
        return self.module("prepare").prepare(weight, config)

    def layout_key(self, config: Config) -> Any:
        return self.module("prepare").layout_key(config)

    def plan(self, config: Config, weight: PreparedWeight, shape: tuple[int, int],
             call: Call, device: Device) -> LaunchPlan:
        return self.module("launch").plan(config, weight, shape, call, device)


@functools.cache
def _module_of(family: type[ModularFamily], name: str) -> ModuleType:
    package = family.__module__.rpartition(".")[0]
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as missing:
        if family.base_package is None or missing.name != f"{package}.{name}":
            raise
        return importlib.import_module(f"{family.base_package}.{name}")


@functools.cache
def enumeration(family: Family, problem: Problem, space: SearchSpace) -> tuple[Config, ...]:
    """Every valid configuration of ``space``'s enumerated values for ``problem``. Cached
    in the process and on disk (keyed on the family's sources): building it took 2.8 s
    for the 43,362 of the FP32 family's row-major 8:32, reading it back 0.14 s, and every
    tuning worker needs it before its first study."""
    path = cache_file("space", (family.name, problem, space), family.source_files())
    return load_or_build(path, lambda: tuple(space.enumerate(problem)), tuple)


@functools.lru_cache(maxsize=32)
def rank_table(family: Family, problem: Problem, gpu: GpuSpec, space: SearchSpace,
               candidates: str = "seed_candidates") -> Ranker:
    """The configurations ``family.<candidates>(problem, space)`` lists (those ``space``
    holds) ranked by the family's model on ``gpu``, for any shape: the table of a study's
    model seeds, of the untuned choice and of the transfer's model guesses. Built once a
    problem, space and GPU (hundreds of milliseconds to seconds), then ranked in
    milliseconds a shape; kept on disk too (building it took ~1 s before every worker's
    first study), and in memory once a process (loading it took 0.39 s a study)."""
    def build() -> Ranker:
        listed = getattr(family, candidates)(problem, space)
        return family.ranker([c for c in listed if space.contains(c)], gpu)

    kind = () if candidates == "seed_candidates" else (candidates,)
    path = cache_file("rank", (family.name, gpu, problem, space, *kind), family.source_files())
    return load_or_build(path, build, object)


def model_ranking(family: Family, problem: Problem, gpu: GpuSpec, shape: Shape,
                  candidates: str = "seed_candidates") -> Sequence[tuple[float, Any]]:
    """``rank_table``'s ranking of one shape over the family's whole space
    (milliseconds: 11 ms for an `mma` space of 2,245 kernels), read by the untuned
    choice and by the transfer's model guesses alike."""
    return _shape_ranking(family, problem, gpu, tuple(shape), candidates)


@functools.lru_cache(maxsize=64)
def _shape_ranking(family: Family, problem: Problem, gpu: GpuSpec, shape: Shape,
                   candidates: str) -> Sequence[tuple[float, Any]]:
    return rank_table(family, problem, gpu, family.space, candidates).rank(*shape)
