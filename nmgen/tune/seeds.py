"""Where a study starts: its seeds, in this order, the family's reference kernel, the
winners of the nearest shapes tuned so far, other GPUs' winners of the problem moved here
(``nmgen.other_gpus``: measured again on this GPU, as every seed is; the records a tune
writes stay this GPU's), the kernels of other tuned patterns and
vector lengths adapted to the problem (ranked by the model calibrated to the GPU's
records: ``nmgen.transfer``), then the model's best guesses, one a seed shape
(``model_seeds``). The worker that creates a study ranks them once for all workers
(``nmgen.tune.studies``); the spare compile processes build them ahead of it."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine

from ..calibration import shipped_calibration
from ..families.base import Config, Ranker, rank_table
from ..other_gpus import GpuModel, borrowed, figures_of
from ..policy import RelatedRecord, Winner, best_per_problem, other_gpu_records, related_records
from ..shapes import shape_distance
from ..store.records import ProblemKey
from ..transfer import MODEL, ranked
from .task import TuneTask

SEEDS_FROM_MODEL = 6
SEEDS_FROM_TUNED = 3
SEEDS_FROM_TRANSFER = 3  # kernels of other tuned patterns and vector lengths, adapted
# Other GPUs' kernels of the problem, fastest moved here first: a quick tune on an H200
# seeded without them found records of the example's 8:32 shapes that ran 0.73-1.18x the
# H100's records moved there (results/other_gpus_h200/quick_records/).
SEEDS_FROM_OTHER_GPUS = 3


def seed_table(task: TuneTask) -> Ranker:
    """Where a study's model seeds come from: the family's seed candidates in the task's
    space ranked by its model (``families.base.rank_table``: built once a problem and
    space, kept on disk, ranked for each shape in a few milliseconds)."""
    return rank_table(task.family, task.problem, task.gpu, task.space)


@functools.lru_cache(maxsize=1024)
def model_seeds(task: TuneTask, count: int) -> tuple[Config, ...]:
    """The model's best feasible configurations, one a seed shape, and the best of the
    family's variants of the first where the model expects it faster; cached, as a
    study's seeds are asked for ahead of it (compile ahead) and again when it runs."""
    ranked = seed_table(task).rank(*task.shape)
    seeds: list[Config] = []
    shapes_seen: set[tuple] = set()
    for _, config in ranked:  # one configuration a seed shape: diverse first guesses
        shape = task.family.seed_shape(config)
        if shape not in shapes_seen:
            shapes_seen.add(shape)
            seeds.append(config)
        if len(seeds) == count:
            break
    if seeds:
        variants = task.family.seed_variants(seeds[0], task.space)
        best_variant = task.family.ranker(variants, task.gpu).rank(*task.shape)
        if best_variant and best_variant[0][0] < ranked[0][0]:
            seeds.insert(1, best_variant[0][1])
    return tuple(seeds[:count])


def reference_seed(task: TuneTask) -> list[Config]:
    """The family's reference kernel for ``task``, where it has one in the space."""
    reference = task.family.reference_config(task.problem)
    return [reference] if reference is not None and task.space.contains(reference) else []


def nearest_winners(shape: tuple[int, int, int], winners: dict[tuple[int, int, int], Winner]
                    ) -> list[Config]:
    """The winners of the shapes nearest ``shape`` among ``winners`` (by shape; nearest
    first, at most ``SEEDS_FROM_TUNED`` distinct configurations)."""
    nearest = sorted(((s, w) for s, w in winners.items() if s != shape),
                     key=lambda sw: (shape_distance(sw[0], shape), sw[1].config.name))
    return list(dict.fromkeys(w.config for _, w in nearest))[:SEEDS_FROM_TUNED]


@dataclass
class Seeder:
    """A tuner's seeds of a study (``seeds``), read from its database ``engine`` (the
    trials of ``status``: a dry run's estimates in a dry run) and, for the transfer,
    from ``transfer_engines`` too; ``related`` keeps the latter's records by family
    problem (the tuner's, across studies)."""

    engine: Engine
    status: str
    model_count: int = SEEDS_FROM_MODEL
    transfer_count: int = SEEDS_FROM_TRANSFER
    transfer_engines: tuple = ()
    related: dict = field(default_factory=dict)
    other_gpu_count: int = SEEDS_FROM_OTHER_GPUS

    def seeds(self, task: TuneTask, key: ProblemKey) -> list[Config]:
        """What a study tries first, in this order: the family's hand-picked reference
        configuration (the reference no tuned shape should fall below; ``confirm`` times
        it again beside the finalists), the winners of the nearest shapes already tuned,
        other GPUs' kernels of the problem (``other_gpu_count``), the kernels of other
        tuned patterns and vector lengths adapted to the problem (``transfer_count``), then
        the model's best guesses."""
        seeds = [*reference_seed(task), *self.neighbours(task, key),
                 *self.other_gpus(task, key), *self.transferred(task, key),
                 *model_seeds(task, self.model_count)]
        return [c for c in dict.fromkeys(seeds) if task.space.contains(c)]

    def transferred(self, task: TuneTask, key: ProblemKey) -> list[Config]:
        """The ``transfer_count`` best by the calibrated model of the kernels that tuned
        problems of other patterns and vector lengths (of this family, dtype and A
        layout; in this database and ``transfer_engines``) won, adapted to ``task``."""
        if self.transfer_count <= 0:
            return []
        records = self._related_records(task, key)
        if not records:
            return []
        calibration = shipped_calibration(task.family, key, task.gpu)
        found = ranked(task.family, task.problem, task.shape, task.gpu, calibration, records,
                       model_count=0)
        return [c.config for c in found if c.origin != MODEL
                and task.space.contains(c.config)][:self.transfer_count]

    def _related_records(self, task: TuneTask, key: ProblemKey) -> list[RelatedRecord]:
        """Tuned problems of ``task``'s family, dtype and A layout and another pattern or
        vector length (those a transfer adapts): this database's (a dry run's estimates in
        a dry run), then those of ``transfer_engines`` (measured, on ``task``'s GPU) that
        it lacks. This database's problems of ``task``'s pattern are not read: the tune
        fills them, and reading their trials twice a study took 30 ms a study by the end
        of a 100-shape dry run, 3 of its 20 s."""
        status = self.status
        found = {(r.n, r.m, r.vec, r.shape): r
                 for r in related_records(self.engine, key, status=status,
                                          other_patterns=True)}
        cache_key = (key.gpu, key.arch, key.template_hash, key.dtype, key.a_layout)
        if cache_key not in self.related:
            self.related[cache_key] = [r for engine in self.transfer_engines
                                        for r in related_records(engine, key)]
        own = (key.n, key.m, key.vec)
        for record in self.related[cache_key]:
            if (record.n, record.m, record.vec) != own:
                found.setdefault((record.n, record.m, record.vec, record.shape), record)
        return list(found.values())

    def other_gpus(self, task: TuneTask, key: ProblemKey) -> list[Config]:
        """The ``other_gpu_count`` fastest of the kernels other GPUs' records of the
        problem hold (in this database and ``transfer_engines``; those of this
        architecture first, of the shape else of the nearest shape each GPU tuned),
        rebuilt for this GPU's arch and their times moved here by the family's model, as
        dispatch moves them."""
        if self.other_gpu_count <= 0:
            return []
        records = [r for engine in (self.engine, *self.transfer_engines)
                   for r in other_gpu_records(engine, key)]
        if not records:
            return []
        here = GpuModel(task.gpu, shipped_calibration(task.family, key, task.gpu))

        def models_of(other: ProblemKey) -> tuple[GpuModel, GpuModel]:
            there = figures_of(other)
            return here, GpuModel(there, shipped_calibration(task.family, other, there))

        found = borrowed(task.family, task.problem, task.shape, records, models_of,
                         task.family.tunes(task.shape))
        return [b.config for b in found if task.space.contains(b.config)][
            :self.other_gpu_count]

    def neighbours(self, task: TuneTask, key: ProblemKey) -> list[Config]:
        """The winners of the nearest shapes tuned so far (nearest first, at most
        ``SEEDS_FROM_TUNED`` distinct configurations)."""
        return nearest_winners(key.shape, best_per_problem(self.engine, key, self.status))
