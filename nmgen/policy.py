"""Which stored trial wins a problem: the fastest correct one, ties broken by name, or the
family's hand-picked reference kernel where it is within ``REFERENCE_TIE`` of that. The
tuner, dispatch, ``show`` and ``export`` all read winners from here, so they agree."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.engine import Engine

from .families.base import Config
from .families.registry import by_generator, config_from_dict
from .store.records import (
    ProblemKey,
    all_problems,
    family_times,
    other_gpus_of,
    other_gpus_times,
    shape_times,
)
from .store.tables import TrialStatus

# The reference kernel, timed on every shape and again beside the finalists, wins where it
# is within this fraction of the fastest: a smaller difference is within one timing's
# spread (up to 4 % between bench and tuning runs on the H100), and no tuned shape may fall
# below it.
REFERENCE_TIE = 0.01


@dataclass(frozen=True)
class Winner:
    config: Config
    time_ms: float
    shape: tuple[int, int, int]


def pick_winner(times: list[tuple[float, str]], reference: str | None) -> tuple[float, str]:
    """The fastest (time, name), ties broken by name; the reference kernel where its time
    is within ``REFERENCE_TIE`` of that."""
    fastest = min(times)
    if reference is not None:
        for time_ms, name in times:
            if name == reference and time_ms <= fastest[0] * (1.0 + REFERENCE_TIE):
                return time_ms, name
    return fastest


def reference_name(key: ProblemKey) -> str | None:
    """The name of the reference kernel of the family that tuned ``key``, if any."""
    family = by_generator(key.template_hash)
    if family is None:
        return None
    config = family.reference_config(key.problem)
    return config.name if config is not None else None


def best_per_problem(engine: Engine, key: ProblemKey, status: str = TrialStatus.OK,
                     any_cuda: bool = False) -> dict[tuple[int, int, int], Winner]:
    """For every tuned shape of ``key``'s problem: its winner; ``status="model"`` reads a
    dry run's estimates instead of measurements; ``any_cuda``: records of the same GPU
    and kernel source under another CUDA runtime too."""
    reference = reference_name(key)
    winners = {}
    for shape, trials in shape_times(engine, key, status, any_cuda).items():
        time_ms, name = pick_winner([(t, n) for t, n, _ in trials], reference)
        params = next(p for t, n, p in trials if n == name)
        winners[shape] = Winner(config_from_dict(params), time_ms, shape)
    return winners


@dataclass(frozen=True)
class RelatedRecord:
    """A tuned problem of the same family, dtype and A layout as another: its pattern,
    vector length and shape, its winner and next fastest configurations (winner first)
    and the winner's time."""

    n: int
    m: int
    vec: int
    shape: tuple[int, int, int]
    configs: tuple[Config, ...]
    time_ms: float


def related_records(engine: Engine, key: ProblemKey, top: int = 3,
                    status: str = TrialStatus.OK, any_cuda: bool = True,
                    other_patterns: bool = False) -> list[RelatedRecord]:
    """Every tuned problem of ``key``'s GPU, arch, family generator, dtype and A layout
    (``key``'s pattern, vector length and shape aside; ``other_patterns``: only those of
    another pattern or vector length): its winner (as ``best_per_problem`` picks it) and
    its ``top - 1`` next fastest correct trials."""
    out = []
    times = family_times(engine, key, status, any_cuda, other_patterns)
    for (n, m, vec, shape), trials in sorted(times.items()):
        related = key.at(replace(key.problem, n=n, m=m, vec=vec), shape)
        times = [(t, name) for t, name, _ in trials]
        time_ms, winner = pick_winner(times, reference_name(related))
        params = {name: p for _, name, p in trials}
        ordered = [winner] + [name for _, name in sorted(times) if name != winner]
        configs = tuple(config_from_dict(params[name]) for name in ordered[:top])
        out.append(RelatedRecord(n, m, vec, shape, configs, time_ms))
    return out


@dataclass(frozen=True)
class OtherGpuRecord:
    """A tuned shape of a problem on another GPU: its key (that GPU, its arch, the
    shape) and its winner and next fastest correct configurations with their times,
    winner first."""

    key: ProblemKey
    trials: tuple[tuple[Config, float], ...]


def other_gpu_records(engine: Engine, key: ProblemKey, top: int = 4,
                      status: str = TrialStatus.OK) -> list[OtherGpuRecord]:
    """Every tuned shape of ``key``'s problem (pattern, vector length, dtype, A layout;
    ``key``'s generator) on GPUs other than ``key``'s, of any arch this nmgen knows: its
    winner (as ``best_per_problem`` picks it) and its ``top - 1`` next fastest trials."""
    out = []
    times = other_gpus_times(engine, key, status)
    for (device, arch, shape), trials in sorted(times.items(), key=lambda kv: (
            kv[0][0].gpu, kv[0][1], kv[0][2])):
        try:
            other = ProblemKey.of(replace(key.problem, arch=arch), shape, device,
                                  key.template_hash)
            params = {name: config_from_dict(p) for _, name, p in trials}
        except ValueError:  # an arch or configuration this nmgen does not know
            continue
        ordered = sorted((t, name) for t, name, _ in trials)
        time_ms, winner = pick_winner(ordered, reference_name(other))
        ranked = [(time_ms, winner)] + [(t, n) for t, n in ordered if n != winner]
        out.append(OtherGpuRecord(other, tuple((params[n], t) for t, n in ranked[:top])))
    return out


def other_gpus_related(engine: Engine, key: ProblemKey, top: int = 3
                       ) -> dict[ProblemKey, list[RelatedRecord]]:
    """For every GPU other than ``key``'s, of an arch this nmgen knows, that holds
    problems of ``key``'s generator, dtype and A layout: ``key``'s problem and shape on
    that GPU (and its arch), with its tuned problems (``related_records``)."""
    out = {}
    for device, arch in other_gpus_of(engine, key):
        try:
            other = ProblemKey.of(replace(key.problem, arch=arch), key.shape, device,
                                  key.template_hash)
        except ValueError:
            continue
        out[other] = related_records(engine, other, top)
    return out


def summary(engine: Engine) -> list[dict[str, Any]]:
    """One row per stored problem: its winner and how many trials it took. Measured
    trials win; a problem with only a dry run's estimates shows the model's best, marked
    ``measured: False``."""
    out = []
    for problem in all_problems(engine):
        key = problem.key
        reference = reference_name(key)
        best = None
        for status in (TrialStatus.OK, TrialStatus.MODEL):
            good = {name: (t, model) for s, t, name, _, model in problem.trials if s == status}
            if good:
                time_ms, name = pick_winner([(t, n) for n, (t, _) in good.items()], reference)
                best = (name, time_ms, good[name][1], status == TrialStatus.OK)
                break
        flops = 2.0 * key.rows * key.cols * key.depth
        out.append({
            "gpu": key.gpu, "family": _family_name(key), "dtype": key.dtype,
            "pattern": f"{key.n}:{key.m}", "vec": key.vec, "a_layout": key.a_layout,
            "shape": key.shape, "trials": len(problem.trials),
            "ok": sum(s == TrialStatus.OK for s, *_ in problem.trials),
            "best": best[0] if best else None,
            "time_ms": best[1] if best else None,
            "tflops": flops / best[1] / 1e9 if best else None,
            "model_ms": best[2] if best else None,
            "measured": best[3] if best else False,
        })
    return out


def _family_name(key: ProblemKey) -> str:
    family = by_generator(key.template_hash)
    return family.name if family is not None else "?"
