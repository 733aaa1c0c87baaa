"""``nmgen.dispatch(a, b)``: run the best known kernel for this GPU, dtype, pattern and shape.

The families that serve the problem (``families.registry.serving``) are asked in turn; for
each, the lookup takes the first of:

1. ``exact``: a record of this GPU, problem (pattern, L, dtype, A layout) and shape;
2. ``nearest``: the record of the nearest tuned shape of the same problem, where the
   family tunes the shape asked (``Family.tunes``: a decode record is no guide to a
   prefill shape);
3. the same two from another CUDA runtime's records of the same GPU and kernel source;
4. ``transfer``: where the family tunes the shape and holds records of other patterns or
   vector lengths of the same dtype and A layout, their winners and runners-up adapted to
   the problem, ranked with the model's own best guesses by the model calibrated to this
   GPU's records (``nmgen.transfer``, ``nmgen.calibration``);
5. ``other_gpu``: the records other GPUs hold of the problem, those of this architecture
   first, each kernel rebuilt for this GPU where it can run here and its time moved here
   by the family's model (``nmgen.other_gpus``). Another GPU of this architecture's
   record of the very shape comes before 2-4 where ``other_gpu_first`` is set (the
   default, ``OTHER_GPU_FIRST``; ``NMGEN_OTHER_GPU_FIRST=0`` turns it off), after them
   otherwise, as does every other record of another GPU; where no other GPU holds the
   problem itself, a transfer (as 4) from the problems other GPUs tuned, also counted
   as ``other_gpu``;
6. ``model``: the family's model's choice.

Across families, first the records of this GPU of the problem (and a record of another GPU
that comes before them, as in 5), then other GPUs' records of the very shape, then the
estimates: transfers (4, and 5's from other GPUs' problems), other GPUs' records of other
shapes (their times moved here by the model) and the models' choices, which are times the
model computes for a kernel nobody timed on this problem. Among records, the decision
from the nearest record wins (an exact one is at distance 0), then a family that tunes the
shape before one that does not, then the source in that order, then the time; among
estimates, a family that tunes the shape first, then the shorter estimate (a transfer of
the gemv kernels of L = 128 to element-wise 2:4 came before the sparse-tensor-core model's
choice and ran 0.05-0.91x dense BF16 at M = 1-64 where that choice runs 1.32-1.46x by M:
results/sptc_h200/llama/). Among records, though, another family's record
whose time, scaled to the shape by its model, is ``MUCH_FASTER`` ahead comes first (a
slow family's exact record does not hide a fast family's record of a neighbouring
shape). The user's database comes first, then the one shipped with nmgen. A fallback is
counted and warned about once per problem; a decision from other GPUs' records once.

``tune="quick"`` (or ``NMGEN_TUNE=quick``): where a call finds no exact record, a few
candidates (the decision above first, then the best of the families' nearest records,
transfers and model guesses by the calibrated model) are checked and timed on the GPU at
the caller's shape, once, and stored as trials in the user's database; the fastest runs
(``quick``), and the next call and the next process find it as an exact record.

``bias=`` and ``activation=`` ask for an epilogue (``nmgen.epilogue``): the decision's
configuration with it, or, where its family cannot take it, the next family's decision in
the order above that can.

Decisions and compiled kernels are cached in the process, so the steady-state cost of a
call is a dictionary lookup and a launch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .calibration import Calibration, shipped_calibration
from .codegen import render
from .epilogue import NO_EPILOGUE, Activation, Epilogue
from .families.base import Config, Family
from .families.registry import all_families, family_of, serving
from .format import NMMatrix
from .gpus import GpuSpec, spec_or_h100, table_name
from .other_gpus import GpuModel, borrowed, figures_of, retargeted, with_ceilings
from .policy import (
    OtherGpuRecord,
    RelatedRecord,
    best_per_problem,
    other_gpu_records,
    other_gpus_related,
    pick_winner,
    related_records,
)
from .problem import ALayout, Problem
from .runtime.device import DeviceInfo, device_info, operand
from .runtime.launch import Kernel
from .shapes import MAX_DIM, shape_distance
from .store.database import connect, default_url, shipped_db
from .store.records import (
    DeviceKey,
    ProblemKey,
    latest_ceilings,
    problems_by_generator,
    record_trial,
)
from .store.tables import TrialStatus
from .transfer import nearest_distance, ranked

# Where a decision comes from, best first: a record of this shape, a quick tune's timing
# of this shape in this process, the nearest tuned shape, the same from another CUDA
# runtime's records, kernels of other tuned problems adapted, other GPUs' records moved
# here, the family's model.
SOURCES = ("exact", "quick", "nearest", "exact-other-cuda", "nearest-other-cuda",
           "transfer", "other_gpu", "model")
EXACT = frozenset({"exact", "exact-other-cuda"})  # this GPU's records of the very shape
# Whether another GPU of this architecture's record of the very shape comes before this
# GPU's nearest record and transfer (True) or after them (False): to be settled by
# measurement on GPUs that have both; NMGEN_OTHER_GPU_FIRST=0 sets it off.
OTHER_GPU_FIRST = os.environ.get("NMGEN_OTHER_GPU_FIRST", "1").strip().lower() not in (
    "0", "off", "false", "no")
# Decision tiers, ranked first across families: this GPU's records of the problem, other
# GPUs', and the estimates (transfers from other problems, the models' choices).
OWN, OTHER_GPUS, ESTIMATES = 0, 1, 2
MEASURED = frozenset({"exact", "quick"})  # what a quick tune would not improve on
TUNE_MODES = ("quick",)
QUICK_CANDIDATES = 4  # kernels a quick tune times
NEAREST_RECORDS = 3  # nearest tuned shapes of the problem whose winners it considers
# How much faster another family's measured kernel, its time scaled to the shape by its
# model, must be to come before the nearest record (the mma 2:4 records of Llama shapes
# the wgmma study had not reached ran 0.34x dense, the wgmma ones 0.81x:
# results/tensor_core_h100/llama_l128/); well beyond the model's shape-scaling error.
MUCH_FASTER = 1.5
# ...where that record's shape is at most this far (one dimension twice or half the
# shape's): a model scales a kernel poorly far from its record (a wgmma record of M = 256
# scaled to M = 8 looks faster than the gemv kernels tuned there).
MUCH_FASTER_WITHIN = math.log(2) + 1e-9


@dataclass
class Decision:
    config: Config
    source: str  # one of SOURCES
    # measured (exact, quick, nearest) or estimated (transfer: calibrated; model)
    time_ms: float | None = None
    distance: float = 0.0  # from the problem asked to the record's (inf: the model's)
    origin: str = ""  # transfer: the tuned problem the kernel came from, or "model"
    in_regime: bool = True  # whether the family tunes the shape (``Family.tunes``)
    # a record's time scaled to the shape asked by its family's model (exact: its time)
    at_shape_ms: float | None = None
    tier: int = OWN  # OWN, OTHER_GPUS or ESTIMATES: whose evidence it is

    def rank(self) -> tuple:
        """Across families: this GPU's records, then other GPUs', then the estimates. Among
        records, the record of the nearest shape first (an exact one is at 0; families
        tuned at other M do not mislead one another), then a family built for the shape
        before one that is not, then the source, then the time (comparable where the
        shapes are the same), then the name. Among estimates, a family built for the
        shape first, then the estimated time, then the source, then the name."""
        if self.tier == ESTIMATES:
            return (self.tier, not self.in_regime,
                    math.inf if self.time_ms is None else self.time_ms,
                    SOURCES.index(self.source), self.distance, self.config.name)
        return (self.tier, self.distance, not self.in_regime, SOURCES.index(self.source),
                self.time_ms or 0.0, self.config.name)


def tune_mode(text: str | None) -> str | None:
    """``"quick"``, or ``None`` for no tuning (``None``, ``""``, ``"off"``, ``"0"``)."""
    if text is None or text.strip().lower() in ("", "off", "0", "none"):
        return None
    if text.strip().lower() not in TUNE_MODES:
        raise ValueError(f"tune={text!r}: expected one of {', '.join(TUNE_MODES)} or None")
    return text.strip().lower()


def check_shape(shape: tuple[int, int, int]) -> None:
    """Refuse an (M, N, K) no kernel takes: the kernels index in 32 bits, and N and K of 0
    (or less) leave nothing to multiply (M = 0 is an empty result)."""
    if len(shape) != 3 or not all(hasattr(d, "__index__") and not isinstance(d, bool)
                                  for d in shape):
        raise ValueError(f"shape {shape!r}: expected (M, N, K), three integers")
    m_rows, cols, depth = shape
    if m_rows < 0 or cols < 1 or depth < 1 or max(shape) > MAX_DIM:
        raise ValueError(f"shape (M, N, K) = {shape}: need 0 <= M and 1 <= N, K, each at "
                         f"most {MAX_DIM} (the kernels index in 32 bits)")


class Dispatcher:
    """Holds the databases, the decision cache, the kernel cache and the counters.
    ``device``: the GPU decisions are made for (default: the current device). ``tune``:
    ``"quick"`` to time candidates where a call finds no exact record (default:
    ``NMGEN_TUNE``). ``write_url``: where a quick tune stores its trials (default: the
    user's database, ``NMGEN_DB`` or ``~/.cache/nmgen/tuned.db``, or the first of
    ``db_urls`` unless it is the shipped one; ``""``: nowhere). ``calibrate``: rank
    transfers by the model calibrated to the shipped records of this GPU (else the model
    as it is). ``other_gpu_first``: whether another GPU of this architecture's record of
    the very shape comes before this GPU's nearest record and transfer (default:
    ``OTHER_GPU_FIRST``)."""

    def __init__(self, db_urls: list[str] | None = None, device: DeviceInfo | None = None,
                 tune: str | None = None, write_url: str | None = None,
                 calibrate: bool = True, other_gpu_first: bool | None = None):
        self._urls = db_urls
        self._device = device
        self.tune = tune_mode(tune if tune is not None else os.environ.get("NMGEN_TUNE"))
        self._write_url = write_url
        self._calibrate = calibrate
        self.other_gpu_first = OTHER_GPU_FIRST if other_gpu_first is None else other_gpu_first
        self._engines: list[Any] | None = None
        self._older: dict[str, int] = {}  # problems of an older generator, by database
        self._related: dict[tuple, list[RelatedRecord]] = {}
        self._other_gpus: dict[tuple, list[OtherGpuRecord]] = {}
        self._related_elsewhere: dict[tuple, dict[ProblemKey, list[RelatedRecord]]] = {}
        self._ceilings: dict[str, tuple[float, float] | None] = {}
        self._decisions: dict[tuple, Decision] = {}
        self._ranked: dict[tuple, list[Decision]] = {}
        self._variants: dict[tuple, tuple[Decision, Decision]] = {}
        self._quick_tried: set[tuple] = set()
        self._fast: dict[tuple, tuple[Kernel, str, bool]] = {}
        self._kernels: dict[str, Kernel] = {}
        self._warned: set[object] = set()  # problems warned of, and "other_gpu"
        self._lock = threading.RLock()
        self._count_lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def _dbs(self) -> list[Any]:
        """The databases read, the user's first; only a quick tune writes (to the user's)."""
        if self._engines is None:
            urls = self._urls
            if urls is None:
                urls = [u for u in (default_url(), f"sqlite:///{shipped_db()}")
                        if not _missing_file(u)]
            else:  # the user's database, made by the first quick tune's results
                urls = [u for u in urls if not (u == self._writable() and _missing_file(u))]
            self._engines = [connect(u, writable=False) for u in urls]
            self._older = _older_generator_problems(urls, self._engines)
            for url, count in self._older.items():
                warnings.warn(f"nmgen.dispatch: {url} holds {count} problems tuned by an "
                              "older generator, which no decision reads; `nmgen carry "
                              "--from-rev REV --db URL` re-keys the records of kernels "
                              "whose source is unchanged", stacklevel=3)
        return self._engines

    def older_generator_problems(self) -> dict[str, int]:
        """Per database read, its problems keyed on a generator that is no longer current
        (a change of a family's templates orphans its records until ``nmgen carry``);
        counted once, when the databases are opened."""
        self._dbs()
        return dict(self._older)

    def decide(self, problem: Problem, shape: tuple[int, int, int],
               epilogue: Epilogue = NO_EPILOGUE) -> Decision:
        """The kernel for ``problem`` at ``shape`` (M, N, K), with ``epilogue``."""
        decision = self._decisions.get((problem, shape))
        if decision is None:
            check_shape(shape)
            with self._lock:
                decision = self._decisions.get((problem, shape))
                if decision is None:
                    decision = self._decisions[(problem, shape)] = self._ranking(
                        problem, shape)[0]
        return self._with_epilogue(decision, problem, shape, epilogue)

    def _ranking(self, problem: Problem, shape: tuple[int, int, int]) -> list[Decision]:
        """Each serving family's decision, best first (``Decision.rank``)."""
        ranked = self._ranked.get((problem, shape))
        if ranked is None:
            ranked = self._ranked[(problem, shape)] = self._lookup(problem, shape)
        return ranked

    def _with_epilogue(self, decision: Decision, problem: Problem,
                       shape: tuple[int, int, int], epilogue: Epilogue) -> Decision:
        """``decision`` with ``epilogue``, else the best of the other families' decisions
        whose configuration takes it."""
        if not epilogue:
            return decision
        base, variant = self._variants.get((problem, shape, epilogue), (None, None))
        if base is not decision:  # made once a base decision (a quick tune may change it)
            variant = self._variant(decision, problem, shape, epilogue)
            self._variants[(problem, shape, epilogue)] = (decision, variant)
        return variant

    def _variant(self, decision: Decision, problem: Problem, shape: tuple[int, int, int],
                 epilogue: Epilogue) -> Decision:
        ranked = [decision, *self._ranking(problem, shape)]
        for candidate in ranked:
            config = family_of(candidate.config).with_epilogue(candidate.config, epilogue)
            if config is not None:
                return dataclasses.replace(candidate, config=config)
        raise ValueError(f"no kernel family serving {problem} takes the epilogue "
                         f"{epilogue.tag!r} ({', '.join(d.config.family for d in ranked)})")

    def _lookup(self, problem: Problem, shape: tuple[int, int, int]) -> list[Decision]:
        families = serving(problem)
        if not families:
            raise ValueError(f"no kernel family serves {problem}")
        found = [d for f in families if (d := self._lookup_family(f, problem, shape))]
        if not found:
            raise ValueError(f"no kernel of the families serving {problem} fits it "
                             f"({', '.join(f.name for f in families)})")
        return much_faster_first(sorted(found, key=Decision.rank))

    @property
    def device(self) -> DeviceInfo:
        return self._device or device_info()

    def _lookup_family(self, family: Family, problem: Problem, shape: tuple[int, int, int]
                       ) -> Decision | None:
        """The family's decision, in the order of the module docstring."""
        key = problem_key(family, problem, shape, self.device)
        gpu = spec_or_h100(key.gpu)
        recorded = self._recorded(family, key, shape, gpu)
        if recorded is not None and recorded.source in EXACT:
            return recorded
        other_gpus = self._borrowed(family, problem, shape, key, gpu)
        if other_gpus is not None and other_gpus.tier == OWN:
            return other_gpus
        if recorded is not None:
            return recorded
        if family.tunes(shape):
            transfer = self._transfer(family, problem, shape, key, gpu)
            if transfer is not None:
                return transfer
        if other_gpus is not None:
            return other_gpus
        if family.tunes(shape):
            transfer = self._transfer_from_other_gpus(family, problem, shape, key, gpu)
            if transfer is not None:
                return transfer
        config = family.default_config(problem, gpu, shape)
        if config is None:
            return None
        return Decision(config, "model", family.estimate_ms(config, gpu, shape), math.inf,
                        in_regime=family.tunes(shape), tier=ESTIMATES)

    def _recorded(self, family: Family, key: ProblemKey, shape: tuple[int, int, int],
                  gpu: GpuSpec) -> Decision | None:
        """The exact or nearest record of the problem (``nearest`` only where the family
        tunes ``shape``: not stretched past its regime)."""
        # Records of this CUDA runtime, then of another runtime of the same GPU and kernel
        # source (the compiler differs, the kernel does not): better than the model.
        for any_cuda, suffix in ((False, ""), (True, "-other-cuda")):
            for engine in self._dbs():
                winners = best_per_problem(engine, key, any_cuda=any_cuda)
                if shape in winners:
                    exact = winners[shape]
                    return Decision(exact.config, "exact" + suffix, exact.time_ms,
                                    at_shape_ms=exact.time_ms)
                if winners and family.tunes(shape):
                    nearest = min(winners.values(), key=lambda w: (
                        shape_distance(w.shape, shape), w.config.name))
                    scale = (family.estimate_ms(nearest.config, gpu, shape)
                             / family.estimate_ms(nearest.config, gpu, nearest.shape))
                    return Decision(nearest.config, "nearest" + suffix, nearest.time_ms,
                                    shape_distance(nearest.shape, shape),
                                    at_shape_ms=nearest.time_ms * scale)
        return None

    def _transfer(self, family: Family, problem: Problem, shape: tuple[int, int, int],
                  key: ProblemKey, gpu: GpuSpec, records: list[RelatedRecord] | None = None,
                  calibration: Calibration | None = None) -> Decision | None:
        """The transfer from ``records`` (default: this GPU's tuned problems), ranked by
        ``calibration`` (default: the model calibrated to this GPU's records)."""
        records = self.related(key) if records is None else records
        distance = nearest_distance(problem, shape, records)
        if not math.isfinite(distance):
            return None
        if calibration is None:
            calibration = self.calibration(family, key, gpu)
        candidates = ranked(family, problem, shape, gpu, calibration, records)
        if not candidates:
            return None
        best = candidates[0]
        return Decision(best.config, "transfer", best.estimate_ms, distance, best.origin,
                        family.tunes(shape), tier=ESTIMATES)

    def _borrowed(self, family: Family, problem: Problem, shape: tuple[int, int, int],
                  key: ProblemKey, gpu: GpuSpec) -> Decision | None:
        """The fastest of other GPUs' kernels for the problem, moved here
        (``nmgen.other_gpus``); ``None`` where no other GPU's record runs here."""
        records = self.other_gpu_records(key)
        if not records:
            return None

        def models_of(other: ProblemKey) -> tuple[GpuModel, GpuModel]:
            here, there = with_ceilings(gpu, figures_of(other), self.ceilings(
                (key.gpu, other.gpu)))
            return (GpuModel(here, self.calibration(family, key, here)),
                    GpuModel(there, self.calibration(family, other, there)))

        found = borrowed(family, problem, shape, records, models_of, family.tunes(shape))
        if not found:
            return None
        best = found[0]
        return Decision(best.config, "other_gpu", best.estimate_ms, best.distance,
                        best.origin, family.tunes(shape), best.estimate_ms,
                        self._borrowed_tier(best.same_arch, best.distance))

    def _borrowed_tier(self, same_arch: bool, distance: float) -> int:
        """Another GPU's record of the very shape is a record of the problem (before this
        GPU's nearest records and transfers, where ``other_gpu_first`` and the GPU is of
        this architecture); one of another shape, its time moved to this GPU and to the
        shape by the model, is an estimate, ranked by time with the models' choices (on an
        H200, the H100's nearest 2:4 L = 128 records ranked first ran 0.68x dense BF16 at
        M = 8 and 32, the sparse-tensor-core model's choice 1.42x / 1.39x:
        results/other_gpus_h200/order/)."""
        if distance > 0:
            return ESTIMATES
        return OWN if self.other_gpu_first and same_arch else OTHER_GPUS

    def _transfer_from_other_gpus(self, family: Family, problem: Problem,
                                  shape: tuple[int, int, int], key: ProblemKey,
                                  gpu: GpuSpec) -> Decision | None:
        """A transfer from the problems other GPUs tuned (those of this architecture
        first), their kernels rebuilt for this GPU's arch: a decision of other GPUs'
        records (``other_gpu``), ranked by the model calibrated to this GPU's records,
        else (none fitted) to those of a GPU of this architecture it transfers from (the
        model misjudges a kind of kernel alike on one architecture)."""
        by_gpu = self.related_elsewhere(key)
        own = self.calibration(family, key, gpu)
        for same_arch in (True, False):
            gpus = sorted((k for k in by_gpu if (k.problem.arch is problem.arch) == same_arch),
                          key=lambda k: k.gpu)
            records = retargeted(family, [r for k in gpus for r in by_gpu[k]], problem)
            borrowed_fit = (c for k in gpus if same_arch and (
                c := self.calibration(family, k, figures_of(k))).fitted)
            calibration = own if own.fitted else next(borrowed_fit, own)
            decision = self._transfer(family, problem, shape, key, gpu, records, calibration)
            if decision is not None:
                names = "+".join(sorted({k.gpu for k in gpus}))
                return dataclasses.replace(decision, source="other_gpu",
                                           origin=f"{names}: {decision.origin}")
        return None

    def related_elsewhere(self, key: ProblemKey) -> dict[ProblemKey, list[RelatedRecord]]:
        """The tuned problems of ``key``'s family, dtype and A layout that other GPUs
        hold, by a key of each GPU, in every database read (the first that holds a GPU),
        kept in the process."""
        cache_key = (key.gpu, key.template_hash, key.dtype, key.a_layout)
        if cache_key not in self._related_elsewhere:
            found: dict[ProblemKey, list[RelatedRecord]] = {}
            for engine in self._dbs():
                for other, records in other_gpus_related(engine, key).items():
                    if not any(k.gpu == other.gpu and k.arch == other.arch for k in found):
                        found[other] = records
            self._related_elsewhere[cache_key] = found
        return self._related_elsewhere[cache_key]

    def other_gpu_records(self, key: ProblemKey) -> list[OtherGpuRecord]:
        """The records GPUs other than ``key``'s hold of its problem, every shape, in
        every database read (the user's first where both hold a GPU's shape), kept in
        the process."""
        cache_key = (key.gpu, key.template_hash, key.problem)
        if cache_key not in self._other_gpus:
            seen: dict[tuple, OtherGpuRecord] = {}
            for engine in self._dbs():
                for record in other_gpu_records(engine, key):
                    seen.setdefault((record.key.gpu, record.key.arch, record.key.shape),
                                    record)
            self._other_gpus[cache_key] = list(seen.values())
        return self._other_gpus[cache_key]

    def ceilings(self, gpus: Sequence[str]) -> dict[str, tuple[float, float]]:
        """The (FP32 TFLOP/s, DRAM GB/s) ceilings ``nmgen bench`` measured of each of
        ``gpus`` that has them (the first database holding them), kept in the process."""
        for name in gpus:
            if name not in self._ceilings:
                rows = (latest_ceilings(engine, name) for engine in self._dbs())
                row = next((r for r in rows if r is not None), None)
                self._ceilings[name] = None if row is None else (row.fp32_tflops,
                                                                 row.dram_gbs)
        return {name: c for name in gpus if (c := self._ceilings[name]) is not None}

    def related(self, key: ProblemKey) -> list[RelatedRecord]:
        """The tuned problems of ``key``'s GPU, family, dtype and A layout in every
        database read (the user's first where both hold a problem), kept in the process."""
        cache_key = (key.gpu, key.arch, key.template_hash, key.dtype, key.a_layout)
        if cache_key not in self._related:
            seen: dict[tuple, RelatedRecord] = {}
            for engine in self._dbs():
                for record in related_records(engine, key):
                    seen.setdefault((record.n, record.m, record.vec, record.shape), record)
            self._related[cache_key] = list(seen.values())
        return self._related[cache_key]

    def calibration(self, family: Family, key: ProblemKey, gpu: GpuSpec) -> Calibration:
        if not self._calibrate:
            return Calibration(family.name)
        return shipped_calibration(family, key, gpu)

    # ------------------------------------------------------------ quick tune
    def quick_candidates(self, problem: Problem, shape: tuple[int, int, int],
                         count: int = QUICK_CANDIDATES) -> list[Config]:
        """What a quick tune times: the decision's kernel, then the fastest by their
        families' calibrated models of the winners of the problem's nearest tuned
        shapes, the transfers and the model's guesses of every family serving the
        problem where it tunes ``shape``; ``count`` distinct kernels at most."""
        first = self.decide(problem, shape).config
        pool: list[tuple[float, str, Config]] = []
        for family in serving(problem):
            if family.tunes(shape) or family is family_of(first):
                pool += self._family_candidates(family, problem, shape)
        ordered = [first] + [c for _, _, c in sorted(pool, key=lambda p: p[:2])]
        return list(dict.fromkeys(ordered))[:count]

    def _family_candidates(self, family: Family, problem: Problem,
                           shape: tuple[int, int, int]) -> list[tuple[float, str, Config]]:
        key = problem_key(family, problem, shape, self.device)
        gpu = spec_or_h100(key.gpu)
        calibration = self.calibration(family, key, gpu)
        own = [w.config for w in self._nearest_winners(key, shape)]
        out = [(calibration.estimate_ms(family, c, gpu, shape), c.name, c) for c in own]
        transfers = ranked(family, problem, shape, gpu, calibration, self.related(key))
        return out + [(c.estimate_ms, c.config.name, c.config) for c in transfers]

    def _nearest_winners(self, key: ProblemKey, shape: tuple[int, int, int]) -> list:
        winners: dict[tuple[int, int, int], Any] = {}
        for engine in self._dbs():
            for s, w in best_per_problem(engine, key, any_cuda=True).items():
                winners.setdefault(s, w)
        return sorted(winners.values(), key=lambda w: (shape_distance(w.shape, shape),
                                                        w.config.name))[:NEAREST_RECORDS]

    def quick_tune(self, problem: Problem, shape: tuple[int, int, int]) -> Decision:
        """Time the quick candidates at ``shape`` on this process's GPU, store them in the
        user's database and decide for the fastest (by ``nmgen.policy``'s rule, as the
        next process will); the earlier decision where none ran correctly."""
        from .runtime.check import time_candidates

        with self._lock:
            fallback = self.decide(problem, shape)
            if (problem, shape) in self._quick_tried or fallback.source in MEASURED:
                return fallback
            self._quick_tried.add((problem, shape))
            timed = time_candidates(problem, shape, self.quick_candidates(problem, shape))
            self.store_timings(problem, shape, timed)
            decision = quick_decision(problem, [(t.config, t.time_ms) for t in timed])
            self._decisions[(problem, shape)] = decision or fallback
            return decision or fallback

    def store_timings(self, problem: Problem, shape: tuple[int, int, int],
                      timed: Sequence[Any]) -> str | None:
        """Record a quick tune's results (``runtime.check.Timed``) as trials in the
        user's database; returns its URL (``None``: there is none to write to)."""
        url = self._writable()
        if url is None:
            return None
        engine = connect(url)
        for t in timed:
            family = family_of(t.config)
            key = problem_key(family, problem, shape, self.device)
            status = (TrialStatus.OK if t.time_ms is not None else
                      TrialStatus.WRONG if t.wrong else TrialStatus.LAUNCH_ERROR)
            record_trial(engine, key, t.config, render(t.config).sha256, status, t.time_ms,
                         family.estimate_ms(t.config, spec_or_h100(key.gpu), shape), t.error)
        engine.dispose()
        # read again, the user's database first
        self._engines, self._related, self._other_gpus = None, {}, {}
        self._related_elsewhere = {}
        return url

    def _writable(self) -> str | None:
        if self._write_url is not None:
            return self._write_url or None  # "": nowhere
        if self._urls is None:
            return default_url()
        shipped = f"sqlite:///{shipped_db()}"
        return self._urls[0] if self._urls and self._urls[0] != shipped else None

    def kernel(self, config: Config) -> Kernel:
        kernel = self._kernels.get(config.name)
        if kernel is None:
            with self._lock:
                kernel = self._kernels.setdefault(config.name, Kernel(config))
        return kernel

    def __call__(self, a: Any, b: NMMatrix, out: Any = None, *, bias: Any = None,
                 activation: Activation | str | None = None, stream: Any = None,
                 tune: str | None = None) -> Any:
        a_op = operand(a, "a")
        # Hot path: one dictionary lookup on what the decision depends on.
        fast = (a_op.device, a_op.shape, a_op.strides, a_op.dtype, b.n, b.m, b.vec, b.shape,
                b._values.dtype, bias is not None, activation)
        hit = self._fast.get(fast)
        if hit is None or (hit[2] and (tune or self.tune)):
            hit = self._fast[fast] = self._choose(a_op, b, tune_mode(tune) or self.tune,
                                                  Epilogue.of(bias is not None, activation))
        kernel, source, _ = hit
        with self._count_lock:  # Counter's += is a read-modify-write
            self.counts[source] += 1
        return kernel.run(a, a_op, b, out, stream, bias)

    def _choose(self, a_op: Any, b: NMMatrix, tune: str | None = None,
                epilogue: Epilogue = NO_EPILOGUE) -> tuple[Kernel, str, bool]:
        """(kernel, source, whether a quick tune may still improve on it)."""
        if a_op.dtype is not b.dtype:
            raise TypeError(f"a is {a_op.dtype_name} but b holds {b.dtype.value} values: "
                            "pass activations in the weight's dtype")
        problem = Problem(b.n, b.m, b.vec, layout_of(a_op.shape, a_op.strides,
                                                     b.dtype.itemsize),
                          self.device.arch, b.dtype)
        shape = (a_op.shape[0], b.shape[1], b.shape[0])
        decision = self.decide(problem, shape)
        if tune == "quick" and decision.source not in MEASURED:
            decision = self.quick_tune(problem, shape)
        if decision.source == "other_gpu":
            self._warn_other_gpus_once(problem, shape, decision)
        elif decision.source not in MEASURED:
            self._warn_once(problem, shape, decision)
        improvable = decision.source not in MEASURED and (problem, shape) not in self._quick_tried
        decision = self._with_epilogue(decision, problem, shape, epilogue)
        return self.kernel(decision.config), decision.source, improvable

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

    def _warn_other_gpus_once(self, problem: Problem, shape: tuple[int, int, int],
                              decision: Decision) -> None:
        if "other_gpu" in self._warned:
            return
        self._warned.add("other_gpu")
        m, n, k = shape
        warnings.warn(f"nmgen.dispatch: no tuned record for "
                      f"{table_name(self.device.name)} {problem} M={m} N={n} K={k}; using "
                      f"another GPU's record ({decision.origin}) moved to this GPU by the "
                      f"model: {decision.config.name} (said once for every problem so "
                      "served; nmgen.dispatch_stats() counts them as 'other_gpu')",
                      stacklevel=4)


def much_faster_first(ranked: list[Decision]) -> list[Decision]:
    """``ranked`` with the fastest of the other families' measured kernels first where,
    its time scaled to the shape, it is ``MUCH_FASTER`` than the first one's and its
    record ``MUCH_FASTER_WITHIN`` of the shape: a slow family's exact record does not
    hide a fast family's record of a neighbouring shape. A rival is of the first one's
    tier (another GPU's record does not pass this GPU's)."""
    first = ranked[0]
    if first.at_shape_ms is None:
        return ranked
    rivals = [d for d in ranked[1:] if d.at_shape_ms is not None and d.in_regime
              and d.tier == first.tier and d.distance <= MUCH_FASTER_WITHIN
              and d.config.family != first.config.family
              and d.at_shape_ms * MUCH_FASTER < first.at_shape_ms]
    if not rivals:
        return ranked
    pick = min(rivals, key=lambda d: (d.at_shape_ms, d.config.name))
    return [pick, *(d for d in ranked if d is not pick)]


def _older_generator_problems(urls: Sequence[str], engines: Sequence[Any]) -> dict[str, int]:
    current = {family.generator_hash() for family in all_families()}
    out = {}
    for url, engine in zip(urls, engines, strict=True):
        count = sum(n for generator, n in problems_by_generator(engine).items()
                    if generator not in current)
        if count:
            out[url] = count
    return out


def _missing_file(url: str) -> bool:
    return url.startswith("sqlite:///") and not Path(url[10:]).exists()


def quick_decision(problem: Problem, timed: Sequence[tuple[Config, float | None]]
                   ) -> Decision | None:
    """The ``quick`` decision among timed configurations (time ``None``: not correct):
    each family's winner by ``nmgen.policy``'s rule (its reference kernel within a tie of
    the fastest), then the fastest of those; ``None`` where none ran correctly."""
    by_family: dict[str, list[tuple[float, str]]] = {}
    configs = {}
    for config, time_ms in timed:
        if time_ms is not None:
            by_family.setdefault(config.family, []).append((time_ms, config.name))
            configs[config.name] = config
    winners = []
    for times in by_family.values():
        family = family_of(configs[times[0][1]])
        reference = family.reference_config(problem)
        winners.append(pick_winner(times, reference.name if reference else None))
    if not winners:
        return None
    time_ms, name = min(winners)
    return Decision(configs[name], "quick", time_ms)


def gpu_name() -> str:
    """The name the current device's records are keyed on."""
    return table_name(device_info().name)


def device_key(info: DeviceInfo) -> DeviceKey:
    """How the store keys the records of device ``info``."""
    return DeviceKey(table_name(info.name), info.name, info.cuda_version, info.sms)


def problem_key(family: Family, problem: Problem, shape: tuple[int, int, int],
                info: DeviceInfo) -> ProblemKey:
    """The database key of ``family``'s records of a problem on device ``info``."""
    return ProblemKey.of(problem, shape, device_key(info), family)


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
             activation: Activation | str | None = None, stream: Any = None,
             tune: str | None = None) -> Any:
    """``activation(a @ b + bias)`` with the best known kernel, the bias (``N`` values in
    ``b``'s dtype) and the activation (``"relu"``, ``"gelu"``, ``"gelu_tanh"``, ``"silu"``)
    in its epilogue where given; ``tune="quick"`` times a few candidates on first use
    where no exact record exists. See the module docstring."""
    return default_dispatcher()(a, b, out=out, bias=bias, activation=activation,
                                stream=stream, tune=tune)


def dispatch_stats() -> dict[str, int]:
    """How many calls were served from each source of ``SOURCES``: an exact record, a
    quick tune, a nearest shape, another CUDA runtime's records, a transfer, other GPUs'
    records, the model."""
    return dict(default_dispatcher().counts)
