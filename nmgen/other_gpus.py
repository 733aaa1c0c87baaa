"""Kernels for a problem this GPU holds no record of, from the records other GPUs hold.

For a family, a problem (pattern, vector length, dtype, A layout) and a shape: the
winners and runners-up that other GPUs measured for the same problem under the same
generator. Those of GPUs of this GPU's architecture come first, then the others; of
each, the records at the shape asked where a GPU tuned it, else (where the family tunes
the shape) each GPU's nearest tuned shape.

A configuration is run only where it can run here: one of another architecture is
rebuilt for this one and kept only where it is valid there and in the family's space
for the problem (an sm_90-only feature such as TMA copies is not; a family that does not
serve the architecture, ``wgmma`` on sm_80, is never asked), and every one must fit this
GPU (``Family.feasible``: shared memory, registers, threads).

Each measured time is moved to this GPU and shape by the family's model,
``t_here = t_there · est_here / est_there``, on the figures of both GPUs (SM count,
bandwidth, peak, shared memory: ``nmgen.gpus``; the ceilings ``nmgen bench`` measured
where both GPUs have them, else the datasheet's) and, where both GPUs hold records enough
to calibrate the model to them (``nmgen.calibration``), with both estimates calibrated.
Dispatch takes the fastest so moved.

Where no other GPU holds the problem itself, the problems of other patterns and vector
lengths that they tuned serve a transfer (``nmgen.transfer``) as this GPU's own would,
their kernels rebuilt for this GPU's arch first (``retargeted``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from .calibration import Calibration
from .families.base import Config, Family
from .gpus import GPUS, Arch, GpuSpec, spec_or_h100
from .policy import OtherGpuRecord, RelatedRecord
from .problem import Problem
from .shapes import Shape, shape_distance
from .store.records import ProblemKey


@dataclass(frozen=True)
class GpuModel:
    """A GPU's figures and the family's model calibrated to its records."""

    gpu: GpuSpec
    calibration: Calibration

    def estimate_ms(self, family: Family, config: Config, shape: Shape,
                    calibrated: bool) -> float:
        if calibrated:
            return self.calibration.estimate_ms(family, config, self.gpu, shape)
        return family.estimate_ms(config, self.gpu, shape)


# The models of this GPU and of the GPU of a record (``ProblemKey``), in that order.
ModelsOf = Callable[[ProblemKey], tuple[GpuModel, GpuModel]]


@dataclass(frozen=True)
class Borrowed:
    """Another GPU's kernel for the problem asked: the configuration as it runs here, its
    time moved to this GPU and shape, where it came from (``h100 1x4096x4096``), the
    shape distance of that record and whether its GPU is of this architecture."""

    config: Config
    estimate_ms: float
    origin: str
    distance: float
    same_arch: bool


def figures_of(key: ProblemKey) -> GpuSpec:
    """The figures of the GPU of a record: its table entry, else the H100's with the
    record's arch and SM count."""
    if key.gpu in GPUS:
        return GPUS[key.gpu]
    return replace(spec_or_h100(key.gpu), arch=Arch(key.arch), sms=key.sms)


def with_ceilings(here: GpuSpec, there: GpuSpec,
                  ceilings: Mapping[str, tuple[float, float]]) -> tuple[GpuSpec, GpuSpec]:
    """Both GPUs' figures with the (FP32 TFLOP/s, DRAM GB/s) ceilings measured on them
    where both have them; else both as the table gives them (a ratio of a measured
    figure over a datasheet one would favour the datasheet's GPU)."""
    if here.name not in ceilings or there.name not in ceilings:
        return here, there

    def measured(gpu: GpuSpec) -> GpuSpec:
        fp32, dram = ceilings[gpu.name]
        return replace(gpu, peak_fp32_tflops=fp32, dram_gbs=dram)

    return measured(here), measured(there)


def retarget(family: Family, config: Config, problem: Problem) -> Config | None:
    """``config`` (another GPU's) as a kernel for ``problem``'s arch: itself on the same
    arch; elsewhere the same configuration built for this arch where it is valid there
    and one the family's space offers the problem (``None`` otherwise)."""
    if config.arch is problem.arch:
        return config
    values = {**config.to_dict(), "arch": problem.arch.value}
    try:
        rebuilt = family.config_from_dict(values)
    except (ValueError, TypeError):
        return None
    return rebuilt if family.in_space(rebuilt, problem) else None


def records_read(records: Sequence[OtherGpuRecord], problem: Problem, shape: Shape,
                 tunes: bool) -> list[OtherGpuRecord]:
    """The records a decision reads: of GPUs of ``problem``'s arch first, else of the
    others; of those, the records at ``shape``, else (``tunes``: where the family tunes
    the shape) each GPU's record of the shape nearest it."""
    for same_arch in (True, False):
        group = [r for r in records if (r.key.problem.arch is problem.arch) == same_arch]
        exact = [r for r in group if r.key.shape == tuple(shape)]
        if exact:
            return exact
        if tunes and group:
            nearest: dict[str, OtherGpuRecord] = {}
            for record in sorted(group, key=lambda r: (shape_distance(r.key.shape, shape),
                                                       r.key.shape)):
                nearest.setdefault(record.key.gpu, record)
            return list(nearest.values())
    return []


def borrowed(family: Family, problem: Problem, shape: Shape,
             records: Sequence[OtherGpuRecord], models_of: ModelsOf, tunes: bool
             ) -> list[Borrowed]:
    """The kernels of ``records_read`` that run here, each with its measured time moved
    to this GPU and ``shape``; fastest first (ties by name), each configuration once."""
    found: dict[str, Borrowed] = {}
    for record in records_read(records, problem, shape, tunes):
        here, there = models_of(record.key)
        calibrated = here.calibration.fitted and there.calibration.fitted
        m, n, k = record.key.shape
        for config, time_ms in record.trials:
            local = retarget(family, config, problem)
            if local is None or family.feasible(local, here.gpu) is not None:
                continue
            moved = time_ms * (here.estimate_ms(family, local, shape, calibrated)
                               / there.estimate_ms(family, config, record.key.shape,
                                                   calibrated))
            candidate = Borrowed(local, moved, f"{record.key.gpu} {m}x{n}x{k}",
                                 shape_distance(record.key.shape, shape),
                                 record.key.problem.arch is problem.arch)
            held = found.get(local.name)
            if held is None or candidate.estimate_ms < held.estimate_ms:
                found[local.name] = candidate
    return sorted(found.values(), key=lambda b: (b.estimate_ms, b.config.name))


def retargeted(family: Family, records: Sequence[RelatedRecord], problem: Problem
               ) -> list[RelatedRecord]:
    """Another GPU's tuned problems (of ``problem``'s dtype and A layout) with their
    kernels rebuilt for ``problem``'s arch (``retarget``), those that cannot be dropped,
    and a problem left with none."""
    out = []
    for record in records:
        own = Problem(record.n, record.m, record.vec, problem.a_layout, problem.arch,
                      problem.dtype)
        configs = tuple(c for c in (retarget(family, config, own) for config in record.configs)
                        if c is not None)
        if configs:
            out.append(replace(record, configs=configs))
    return out
