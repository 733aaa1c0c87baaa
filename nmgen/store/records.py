"""Rows and queries of the tuned database: problem keys, trials recorded and read back,
times updated, ceilings. Which trial wins is not decided here (``nmgen.policy``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, or_, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..problem import Problem
from ..shapes import Shape
from ..version import __version__
from .database import retry_on_race
from .tables import CeilingRow, ConfigRow, GpuRow, ProblemRow, TrialRow

if TYPE_CHECKING:
    from ..families.base import Family


@dataclass(frozen=True)
class DeviceKey:
    """The GPU records are measured on, as the store keys it: its table name (``h100``),
    CUDA device name, CUDA runtime version and SM count."""

    gpu: str
    device_name: str
    cuda_version: int
    sms: int


@dataclass(frozen=True)
class ProblemKey:
    """Everything that changes which kernel is fastest or right: the problem (pattern, L,
    A layout, arch, dtype), the shape, the GPU and the family's generator. Made by
    ``ProblemKey.of`` alone (``of_row`` and ``at`` go through it), so that dispatch, the
    tuner and the calibration key records alike; the store's columns are read from it."""

    problem: Problem
    shape: Shape
    device: DeviceKey
    template_hash: str

    @classmethod
    def of(cls, problem: Problem, shape: Sequence[int], device: DeviceKey,
           family: Family | str) -> ProblemKey:
        """The key of ``family``'s records of ``problem`` at ``shape`` (M, N, K) on
        ``device``; ``family`` may be a generator hash instead (records of a generator no
        longer current, which ``nmgen carry`` re-keys)."""
        generator = family if isinstance(family, str) else family.generator_hash()
        rows, cols, depth = (int(x) for x in shape)
        return cls(problem, (rows, cols, depth), device, generator)

    @classmethod
    def of_row(cls, row: ProblemRow, template_hash: str | None = None) -> ProblemKey:
        """The key of a stored problem (under another generator's hash if given); raises
        ``ValueError`` for an arch, layout or dtype this nmgen does not know."""
        gpu = row.gpu
        problem = Problem(row.n, row.m, row.vec, row.a_layout, gpu.arch, row.dtype)
        device = DeviceKey(gpu.name, gpu.device_name, gpu.cuda_version, gpu.sms)
        return cls.of(problem, (row.rows, row.cols, row.depth), device,
                      template_hash or row.template_hash)

    def at(self, problem: Problem, shape: Sequence[int]) -> ProblemKey:
        """The key of another problem and shape on the same GPU, of the same generator."""
        return ProblemKey.of(problem, shape, self.device, self.template_hash)

    # The store's columns, as its queries compare them.
    @property
    def gpu(self) -> str:
        return self.device.gpu

    @property
    def device_name(self) -> str:
        return self.device.device_name

    @property
    def cuda_version(self) -> int:
        return self.device.cuda_version

    @property
    def sms(self) -> int:
        return self.device.sms

    @property
    def arch(self) -> str:
        return self.problem.arch.value

    @property
    def n(self) -> int:
        return self.problem.n

    @property
    def m(self) -> int:
        return self.problem.m

    @property
    def vec(self) -> int:
        return self.problem.vec

    @property
    def dtype(self) -> str:
        return self.problem.dtype.value

    @property
    def a_layout(self) -> str:
        return self.problem.a_layout.value

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[1]

    @property
    def depth(self) -> int:
        return self.shape[2]

    def without_shape(self) -> tuple:
        """All but the shape: records a nearest-shape lookup may borrow from."""
        return (self.gpu, self.arch, self.cuda_version, self.template_hash, self.n, self.m,
                self.vec, self.dtype, self.a_layout)


def get_or_create(session: Session, model, defaults: dict | None = None, **keys):
    row = session.scalars(select(model).filter_by(**keys)).first()
    if row is None:
        row = model(**keys, **(defaults or {}))
        session.add(row)
        session.flush()
    return row


def problem_row(session: Session, key: ProblemKey) -> ProblemRow:
    gpu = get_or_create(session, GpuRow, defaults={"device_name": key.device_name,
                                                    "sms": key.sms},
                         name=key.gpu, arch=key.arch, cuda_version=key.cuda_version)
    return get_or_create(session, ProblemRow, gpu_id=gpu.id, template_hash=key.template_hash,
                          n=key.n, m=key.m, vec=key.vec, dtype=key.dtype,
                          a_layout=key.a_layout, rows=key.rows, cols=key.cols,
                          depth=key.depth)


def config_row(session: Session, config: Any, source_hash: str) -> ConfigRow:
    return get_or_create(session, ConfigRow,
                          defaults={"params": config.to_dict(), "nmgen_version": __version__},
                          name=config.name, source_hash=source_hash)


def record_trial(engine: Engine, key: ProblemKey, config: Any, source_hash: str,
                 status: str, time_ms: float | None = None, model_ms: float | None = None,
                 error: str | None = None) -> tuple[str, float | None]:
    """Store one result; returns the (status, time) the database holds for this
    configuration and problem: another worker's, where it was first."""
    flops = 2.0 * key.rows * key.cols * key.depth

    def insert() -> tuple[str, float | None]:
        with Session(engine) as session, session.begin():
            problem = problem_row(session, key)
            cfg = config_row(session, config, source_hash)
            held = session.execute(select(TrialRow.status, TrialRow.time_ms).where(
                TrialRow.problem_id == problem.id, TrialRow.config_id == cfg.id)).first()
            if held is not None:
                return held.status, held.time_ms
            session.add(TrialRow(problem_id=problem.id, config_id=cfg.id, status=status,
                                 time_ms=time_ms, model_ms=model_ms, error=error,
                                 tflops=flops / time_ms / 1e9 if time_ms else None))
        return status, time_ms

    # Another worker may insert the same unique row first: the retry then reads it.
    return retry_on_race(insert, attempts=4, errors=(IntegrityError,), delay_s=0.0)


def update_times(engine: Engine, key: ProblemKey, times: dict[str, float]) -> None:
    """Replace the stored time of each named configuration of ``key``'s problem (a second,
    fairer timing of the finalists; see ``nmgen.tune.tuner.Tuner.confirm``)."""
    flops = 2.0 * key.rows * key.cols * key.depth
    with Session(engine) as session, session.begin():
        for row in session.scalars(
                select(TrialRow).join(TrialRow.problem).join(ProblemRow.gpu)
                .join(TrialRow.config_row)
                .where(*_problem_filter(key), ProblemRow.rows == key.rows,
                       ProblemRow.cols == key.cols, ProblemRow.depth == key.depth,
                       ConfigRow.name.in_(list(times)))):
            row.time_ms = times[row.config_row.name]
            row.tflops = flops / row.time_ms / 1e9


def _problem_filter(key: ProblemKey, any_cuda: bool = False):
    return (*_family_filter(key, any_cuda), ProblemRow.n == key.n, ProblemRow.m == key.m,
            ProblemRow.vec == key.vec)


def _family_filter(key: ProblemKey, any_cuda: bool = False):
    """Records of ``key``'s GPU, arch, family generator, dtype and A layout."""
    cuda = () if any_cuda else (GpuRow.cuda_version == key.cuda_version,)
    return (GpuRow.name == key.gpu, GpuRow.arch == key.arch, *cuda,
            ProblemRow.template_hash == key.template_hash, ProblemRow.dtype == key.dtype,
            ProblemRow.a_layout == key.a_layout)


def trials_of(engine: Engine, key: ProblemKey) -> list[TrialRow]:
    with Session(engine) as session:
        stmt = (select(TrialRow).join(TrialRow.problem).join(ProblemRow.gpu)
                .where(*_problem_filter(key), ProblemRow.rows == key.rows,
                       ProblemRow.cols == key.cols, ProblemRow.depth == key.depth))
        rows = list(session.scalars(stmt))
        for row in rows:  # load while the session is open
            _ = row.config_row.name
        return rows


def record_ceilings(engine: Engine, gpu: str, device_name: str, fp32_tflops: float,
                    dram_gbs: float) -> None:
    with Session(engine) as session, session.begin():
        session.add(CeilingRow(gpu=gpu, device_name=device_name, fp32_tflops=fp32_tflops,
                               dram_gbs=dram_gbs))


def latest_ceilings(engine: Engine, gpu: str) -> CeilingRow | None:
    with Session(engine) as session:
        return session.scalars(select(CeilingRow).where(CeilingRow.gpu == gpu)
                               .order_by(CeilingRow.measured.desc(), CeilingRow.id.desc())
                               ).first()


def shape_times(engine: Engine, key: ProblemKey, status: str, any_cuda: bool = False,
                only_shape: bool = False
                ) -> dict[tuple[int, int, int], list[tuple[float, str, dict]]]:
    """For every shape of ``key``'s problem (all but the shape; ``only_shape``: ``key``'s
    shape alone): the (time, name, parameters) of each of its trials of ``status``;
    ``any_cuda``: recorded under any CUDA runtime, the newest runtime's where several
    hold a shape."""
    shape = (ProblemRow.rows == key.rows, ProblemRow.cols == key.cols,
             ProblemRow.depth == key.depth) if only_shape else ()
    stmt = (select(ProblemRow.rows, ProblemRow.cols, ProblemRow.depth, TrialRow.time_ms,
                   ConfigRow.name, ConfigRow.params, GpuRow.cuda_version)
            .join(TrialRow.problem).join(ProblemRow.gpu).join(TrialRow.config_row)
            .where(*_problem_filter(key, any_cuda), *shape, TrialRow.status == status))
    runtimes: dict[tuple[int, int, int], dict[int, list]] = {}
    with Session(engine) as session:
        for rows, cols, depth, time_ms, name, params, cuda in session.execute(stmt):
            runtimes.setdefault((rows, cols, depth), {}).setdefault(cuda, []).append(
                (time_ms, name, params))
    return {shape: by_cuda[max(by_cuda)] for shape, by_cuda in runtimes.items()}


def other_gpus_times(engine: Engine, key: ProblemKey, status: str
                     ) -> dict[tuple[DeviceKey, str, Shape], list[tuple[float, str, dict]]]:
    """For every shape that GPUs other than ``key``'s hold of ``key``'s problem (pattern,
    vector length, dtype, A layout; any arch) under ``key``'s generator, by (the GPU as a
    ``DeviceKey``, its arch, the shape): the (time, name, parameters) of each of its
    trials of ``status``; the newest CUDA runtime's where a GPU holds a shape under
    several."""
    stmt = (select(GpuRow.name, GpuRow.device_name, GpuRow.arch, GpuRow.cuda_version,
                   GpuRow.sms, ProblemRow.rows, ProblemRow.cols, ProblemRow.depth,
                   TrialRow.time_ms, ConfigRow.name, ConfigRow.params)
            .join(TrialRow.problem).join(ProblemRow.gpu).join(TrialRow.config_row)
            .where(GpuRow.name != key.gpu, ProblemRow.template_hash == key.template_hash,
                   ProblemRow.dtype == key.dtype, ProblemRow.a_layout == key.a_layout,
                   ProblemRow.n == key.n, ProblemRow.m == key.m, ProblemRow.vec == key.vec,
                   TrialRow.status == status))
    runtimes: dict[tuple[str, str, Shape], dict[int, tuple[DeviceKey, list]]] = {}
    with Session(engine) as session:
        for (gpu, device_name, arch, cuda, sms, rows, cols, depth, time_ms, name,
             params) in session.execute(stmt):
            by_cuda = runtimes.setdefault((gpu, arch, (rows, cols, depth)), {})
            device = DeviceKey(gpu, device_name, cuda, sms)
            by_cuda.setdefault(cuda, (device, []))[1].append((time_ms, name, params))
    out = {}
    for (_, arch, shape), by_cuda in runtimes.items():
        device, trials = by_cuda[max(by_cuda)]
        out[(device, arch, shape)] = trials
    return out


def other_gpus_of(engine: Engine, key: ProblemKey) -> list[tuple[DeviceKey, str]]:
    """The GPUs other than ``key``'s (with their arch) that hold problems of ``key``'s
    generator, dtype and A layout, the newest CUDA runtime's row of each."""
    stmt = (select(GpuRow.name, GpuRow.device_name, GpuRow.arch, GpuRow.cuda_version,
                   GpuRow.sms).distinct()
            .join(ProblemRow, ProblemRow.gpu_id == GpuRow.id)
            .where(GpuRow.name != key.gpu, ProblemRow.template_hash == key.template_hash,
                   ProblemRow.dtype == key.dtype, ProblemRow.a_layout == key.a_layout))
    newest: dict[tuple[str, str], DeviceKey] = {}
    with Session(engine) as session:
        for name, device_name, arch, cuda, sms in session.execute(stmt):
            held = newest.get((name, arch))
            if held is None or cuda > held.cuda_version:
                newest[(name, arch)] = DeviceKey(name, device_name, cuda, sms)
    return [(device, arch) for (_, arch), device in sorted(newest.items())]


# A stored problem of one family, dtype and A layout: pattern, vector length and shape.
Related = tuple[int, int, int, tuple[int, int, int]]


def family_times(engine: Engine, key: ProblemKey, status: str, any_cuda: bool = False,
                 other_patterns: bool = False
                 ) -> dict[Related, list[tuple[float, str, dict]]]:
    """For every problem of ``key``'s GPU, arch, family generator, dtype and A layout,
    whatever its pattern, vector length and shape, by ``(n, m, vec, shape)``: the (time,
    name, parameters) of its trials of ``status``; ``any_cuda`` as in ``shape_times``;
    ``other_patterns``: only problems of another pattern or vector length than ``key``'s."""
    others = (or_(ProblemRow.n != key.n, ProblemRow.m != key.m, ProblemRow.vec != key.vec),
              ) if other_patterns else ()
    stmt = (select(ProblemRow.n, ProblemRow.m, ProblemRow.vec, ProblemRow.rows,
                   ProblemRow.cols, ProblemRow.depth, TrialRow.time_ms, ConfigRow.name,
                   ConfigRow.params, GpuRow.cuda_version)
            .join(TrialRow.problem).join(ProblemRow.gpu).join(TrialRow.config_row)
            .where(*_family_filter(key, any_cuda), *others, TrialRow.status == status))
    runtimes: dict[Related, dict[int, list]] = {}
    with Session(engine) as session:
        for n, m, vec, rows, cols, depth, time_ms, name, params, cuda in session.execute(stmt):
            runtimes.setdefault((n, m, vec, (rows, cols, depth)), {}).setdefault(
                cuda, []).append((time_ms, name, params))
    return {problem: by_cuda[max(by_cuda)] for problem, by_cuda in runtimes.items()}


@dataclass(frozen=True)
class ProblemTrials:
    """A stored problem with its trials: (status, time, name, parameters, model time)."""

    key: ProblemKey
    trials: list[tuple[str, float | None, str, dict, float | None]]


def all_problems(engine: Engine) -> list[ProblemTrials]:
    """Every stored problem and its trials; a problem of an arch, A layout or dtype this
    nmgen does not know (a newer one's records) is left out: nothing here runs it."""
    out = []
    with Session(engine) as session:
        for problem in session.scalars(select(ProblemRow)):
            try:
                key = ProblemKey.of_row(problem)
            except ValueError:
                continue
            trials = [(t.status, t.time_ms, t.config_row.name, t.config_row.params, t.model_ms)
                      for t in session.scalars(select(TrialRow).where(
                          TrialRow.problem_id == problem.id))]
            out.append(ProblemTrials(key, trials))
    return out


def problems_by_generator(engine: Engine) -> dict[str, int]:
    """How many stored problems (with trials) each generator hash keys."""
    with Session(engine) as session:
        rows = session.execute(
            select(ProblemRow.template_hash, func.count(func.distinct(ProblemRow.id)))
            .join(TrialRow, TrialRow.problem_id == ProblemRow.id)
            .group_by(ProblemRow.template_hash))
        return {template_hash: count for template_hash, count in rows}
