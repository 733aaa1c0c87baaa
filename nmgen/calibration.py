"""A family's analytic model calibrated to one GPU's measured records.

Per GPU, family and dtype, a ridge least-squares fit in log space of the measured time
over the model's estimate::

    log(measured / estimate) = b + s·log(estimate)
                               + Σ_v w_v·[v] + Σ_v u_v·[v]·(log M − c)
                               + Σ_v l_v·[v]·(log L − d)   (``Family.calibrate_by_vec``)

where ``[v]`` is 1 where the configuration takes value ``v`` of one of its space's
parameters (the space the family declares: nothing here names a family's parameters),
``log M − c`` places the shape's rows in the regime of the records (``c``: their mean) and
``log L − d`` the vector length (``d``: the records' mean), for the families whose tiles
change with L. The terms correct what the model misjudges about a kind of kernel and how
that changes with M (and L); the calibrated estimate ranks the candidates of an untuned
problem (``nmgen.transfer``).
A family without enough records keeps its model as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from sqlalchemy.engine import Engine

from .cache import cache_file, load_or_build
from .families.base import Config, Family
from .gpus import GpuSpec
from .problem import ALayout
from .shapes import Shape
from .store.database import connect, shipped_db
from .store.records import ProblemKey, family_times
from .store.tables import TrialStatus

RIDGE = 3.0  # the held-out order was best between 1 and 10 (tools/model_order_check.py)
MIN_SAMPLES = 30
MIN_SHAPES = 5


@dataclass(frozen=True)
class Sample:
    """One measured trial: its configuration, shape, model estimate and time."""

    config: Config
    shape: Shape
    estimate_ms: float
    time_ms: float


@dataclass(frozen=True)
class Calibration:
    """The fitted correction of one family's model; no terms: the model as it is."""

    family: str
    terms: tuple[tuple[str, str], ...] = ()  # (parameter, value) indicators
    weights: tuple[float, ...] = ()  # b, s, then w per term, then u per term
    center: float = 0.0  # c: the mean log M of the records
    samples: int = 0
    vec_center: float = 0.0  # d: the mean log L of the records

    @property
    def fitted(self) -> bool:
        return bool(self.weights)

    def log_correction(self, family: Family, config: Config, shape: Shape,
                       estimate_ms: float) -> float:
        """log(calibrated / model estimate) of ``config`` on ``shape``."""
        if not self.fitted:
            return 0.0
        return float(np.dot(self.weights, _features(family, config, shape, estimate_ms,
                                                    self.terms, self.center,
                                                    self.vec_center)))

    def estimate_ms(self, family: Family, config: Config, gpu: GpuSpec, shape: Shape) -> float:
        """The model's time of ``config`` on ``shape``, calibrated."""
        raw = family.estimate_ms(config, gpu, shape)
        return raw * math.exp(self.log_correction(family, config, shape, raw))


def _term_values(family: Family, config: Config) -> set[tuple[str, str]]:
    return {(name, repr(v)) for name, v in family.space.values_of(config).items()}


def _features(family: Family, config: Config, shape: Shape, estimate_ms: float,
              terms: Sequence[tuple[str, str]], center: float, vec_center: float
              ) -> np.ndarray:
    present = _term_values(family, config)
    indicators = np.array([t in present for t in terms], dtype=np.float64)
    regime = math.log(max(shape[0], 1)) - center
    by_vec = ([indicators * (math.log(config.vec) - vec_center)] if family.calibrate_by_vec
              else [])
    return np.concatenate(([1.0, math.log(max(estimate_ms, 1e-9))], indicators,
                           indicators * regime, *by_vec))


def fit(family: Family, samples: Sequence[Sample], ridge: float = RIDGE) -> Calibration:
    """The calibration of ``family``'s model to ``samples`` (the model as it is where
    they are fewer than ``MIN_SAMPLES`` or span fewer than ``MIN_SHAPES`` shapes)."""
    good = [s for s in samples if s.time_ms > 0 and s.estimate_ms > 0]
    if len(good) < MIN_SAMPLES or len({s.shape for s in good}) < MIN_SHAPES:
        return Calibration(family.name, samples=len(good))
    terms = tuple(sorted(set().union(*(_term_values(family, s.config) for s in good))))
    center = float(np.mean([math.log(max(s.shape[0], 1)) for s in good]))
    vec_center = float(np.mean([math.log(s.config.vec) for s in good]))
    x = np.array([_features(family, s.config, s.shape, s.estimate_ms, terms, center,
                            vec_center) for s in good])
    y = np.array([math.log(s.time_ms / s.estimate_ms) for s in good])
    penalty = ridge * np.eye(x.shape[1])
    penalty[0, 0] = 0.0  # the intercept is not shrunk
    weights = np.linalg.solve(x.T @ x + penalty, x.T @ y)
    return Calibration(family.name, terms, tuple(float(w) for w in weights), center, len(good),
                       vec_center)


def samples_of(engine: Engine, family: Family, key: ProblemKey, gpu: GpuSpec
               ) -> list[Sample]:
    """The measured trials of ``family`` (whose records ``key`` is of) on ``key``'s GPU,
    arch and dtype (both A layouts, every pattern, vector length and shape, any CUDA
    runtime), with the model's estimates."""
    out = []
    for layout in ALayout:
        related = key.at(replace(key.problem, a_layout=layout), key.shape)
        for (_, _, _, shape), trials in family_times(engine, related, TrialStatus.OK,
                                                     any_cuda=True).items():
            for time_ms, _, params in trials:
                if time_ms is None:
                    continue
                config = family.config_from_dict(params)
                out.append(Sample(config, shape, family.estimate_ms(config, gpu, shape),
                                  time_ms))
    return out


# Fitted calibrations in this process, by (family, GPU name, arch, dtype, GPU figures):
# what a fit depends on of the key it was asked for.
_SHIPPED: dict[tuple, Calibration] = {}


def shipped_calibration(family: Family, key: ProblemKey, gpu: GpuSpec) -> Calibration:
    """``family``'s calibration to the records of ``key``'s GPU, arch and dtype in the
    database shipped with nmgen (``key``: one of ``family``'s problems there; its
    pattern, layout and shape do not matter). Kept in the process and on disk, keyed on
    the family's code and the database."""
    scope = (family, key.gpu, key.arch, key.dtype, gpu)
    if scope not in _SHIPPED:
        _SHIPPED[scope] = _fit_shipped(family, key, gpu)
    return _SHIPPED[scope]


def _fit_shipped(family: Family, key: ProblemKey, gpu: GpuSpec) -> Calibration:
    path = shipped_db()
    if not path.exists():
        return Calibration(family.name)

    def build() -> Calibration:
        engine = connect(f"sqlite:///{path}", writable=False)
        try:
            return fit(family, samples_of(engine, family, key, gpu))
        finally:
            engine.dispose()

    # The records read are those of the family's generator (its templates): an edit of
    # them orphans the records, and restoring it must find them again.
    cached = cache_file("calibration", (family.name, key.gpu, key.arch, key.dtype, gpu, RIDGE),
                        (*family.source_files(), *family.generator_files(), path, __file__))
    return load_or_build(cached, build, Calibration)
