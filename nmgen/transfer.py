"""Kernels for a problem nobody tuned, from the problems that were.

For a family, a problem (pattern, vector length, dtype, A layout) and a shape without a
record of their own: the winners and runners-up of the nearest tuned problems of the same
family, dtype and A layout (nearest by density, vector length, window and shape), each
adapted to the problem (``Family.adapt``), those the GPU cannot run dropped, ranked
together with the model's own best guesses by the family's model calibrated to the GPU's
records (``nmgen.calibration``). Dispatch takes the first; a quick tune times the first
few; a tuning study starts from them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .calibration import Calibration
from .families.base import Config, Family, model_ranking
from .gpus import GpuSpec
from .policy import RelatedRecord
from .problem import Problem
from .shapes import Shape, shape_distance

SOURCE_PROBLEMS = 12  # the nearest tuned problems whose kernels are adapted
CONFIGS_PER_SOURCE = 3  # each one's winner and runners-up
MODEL_CANDIDATES = 4  # the model's best guesses ranked beside them
# How far a tuned problem is from the one asked, beside the shape distance: summed
# weighted |log| ratios. The density n/m changes a kernel's balance of A and B traffic
# most, the vector length its index reads, the window its stage depth.
DENSITY_WEIGHT = 2.0
VEC_WEIGHT = 1.0
WINDOW_WEIGHT = 0.5
MODEL = "model"  # the origin of the model's own guesses


@dataclass(frozen=True)
class Candidate:
    """A configuration for the problem asked: its calibrated estimate, where it came from
    (a tuned problem, ``pattern L=vec MxNxK``, or ``MODEL``) and how far that was."""

    config: Config
    estimate_ms: float
    origin: str
    distance: float


def problem_distance(record: RelatedRecord, problem: Problem, shape: Shape) -> float:
    """How far a tuned problem is from ``problem`` at ``shape``: weighted |log| ratios of
    density, vector length and window, plus the shape distance."""
    def log_ratio(a: float, b: float) -> float:
        return abs(math.log(a / b))

    return (DENSITY_WEIGHT * log_ratio(record.n / record.m, problem.n / problem.m)
            + VEC_WEIGHT * log_ratio(record.vec, problem.vec)
            + WINDOW_WEIGHT * log_ratio(record.m, problem.m)
            + shape_distance(record.shape, shape))


def origin_of(record: RelatedRecord) -> str:
    m, n, k = record.shape
    return f"{record.n}:{record.m} L={record.vec} {m}x{n}x{k}"


def transferred(family: Family, problem: Problem, shape: Shape, gpu: GpuSpec,
                records: Sequence[RelatedRecord]) -> list[tuple[Config, str, float]]:
    """(configuration, origin, distance) of the kernels of the ``SOURCE_PROBLEMS`` tuned
    problems nearest ``problem`` at ``shape``, adapted to it and runnable on ``gpu``,
    nearest first, each configuration once. The problem's own records are left out."""
    own = (problem.n, problem.m, problem.vec)
    others = [r for r in records if (r.n, r.m, r.vec) != own]
    nearest = sorted(others, key=lambda r: (problem_distance(r, problem, shape), r.shape,
                                            r.n, r.m, r.vec))[:SOURCE_PROBLEMS]
    out: dict[str, tuple[Config, str, float]] = {}
    for record in nearest:
        distance = problem_distance(record, problem, shape)
        for config in record.configs[:CONFIGS_PER_SOURCE]:
            adapted = family.adapt(config, problem)
            if (adapted is not None and adapted.name not in out
                    and family.feasible(adapted, gpu) is None):
                out[adapted.name] = (adapted, origin_of(record), distance)
    return list(out.values())


def model_guesses(family: Family, problem: Problem, shape: Shape, gpu: GpuSpec,
                  count: int = MODEL_CANDIDATES) -> list[Config]:
    """The family's default choice and its model's ``count`` best configurations (none
    where ``count`` is 0)."""
    if count <= 0:
        return []
    ranked = [c for _, c in model_ranking(family, problem, gpu, shape)[:count]]
    default = family.default_config(problem, gpu, shape)
    return list(dict.fromkeys(([default] if default is not None else []) + ranked))


def ranked(family: Family, problem: Problem, shape: Shape, gpu: GpuSpec,
           calibration: Calibration, records: Sequence[RelatedRecord],
           model_count: int = MODEL_CANDIDATES) -> list[Candidate]:
    """The transferred kernels and the model's guesses for ``problem`` at ``shape``,
    fastest first by the calibrated model (ties by name); a configuration both
    transferred and guessed keeps its tuned origin."""
    pool = {c.name: (c, origin, distance)
            for c, origin, distance in transferred(family, problem, shape, gpu, records)}
    for config in model_guesses(family, problem, shape, gpu, model_count):
        pool.setdefault(config.name, (config, MODEL, math.inf))
    out = [Candidate(c, calibration.estimate_ms(family, c, gpu, shape), origin, distance)
           for c, origin, distance in pool.values()]
    return sorted(out, key=lambda c: (c.estimate_ms, c.config.name))


def nearest_distance(problem: Problem, shape: Shape, records: Sequence[RelatedRecord]
                     ) -> float:
    """The distance of the nearest tuned problem other than ``problem`` (inf: none)."""
    own = (problem.n, problem.m, problem.vec)
    return min((problem_distance(r, problem, shape) for r in records
                if (r.n, r.m, r.vec) != own), default=math.inf)
