"""The tuner: one Optuna study per (GPU, pattern, L, dtype, A layout, shape).

The model removes infeasible configurations before anything is compiled (they reach
Optuna as constraint violations, not failed trials) and seeds every study with its best
guesses and with the winners of shapes already tuned. Trials come in batches: the batch
compiles in a process pool, then each kernel is checked against the float64 reference
once and timed with CUDA events, one at a time. Studies live in an Optuna RDB storage
(the tuned database's URL by default), so a re-run resumes. The winner is the fastest
correct trial, ties broken by name.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from sqlalchemy.engine import Engine

from .config import ALayout, ATile, KernelConfig
from .db import ProblemKey, TrialStatus, Winner, best_per_problem, record_trial
from .model import GpuSpec, estimate, feasible, rank
from .space import (
    MS_CHOICES,
    MT_CHOICES,
    NS_CHOICES,
    NT_CHOICES,
    STAGE_CHOICES,
    WARP_LAYOUTS,
    Problem,
    enumerate_configs,
    try_config,
)

KS_WINDOW_CHOICES = (1, 2, 4, 8)
SPLIT_K_CHOICES = (1, 2, 4)
INFEASIBLE_MS = 1e9  # value told to Optuna for a violated constraint
SEEDS_FROM_MODEL = 6
SEEDS_FROM_TUNED = 4


@dataclass(frozen=True)
class TuneTask:
    gpu: GpuSpec
    n: int
    m: int
    vec: int
    a_layout: ALayout
    rows: int
    cols: int
    depth: int

    @property
    def problem(self) -> Problem:
        return Problem(self.n, self.m, self.vec, a_layout=self.a_layout, arch=self.gpu.arch)

    @property
    def study_name(self) -> str:
        return (f"nmgen_{self.gpu.name}_{self.n}:{self.m}_l{self.vec}_f32_"
                f"{self.a_layout.value}_{self.rows}x{self.cols}x{self.depth}")

    def key(self, device_name: str, cuda_version: int, template_hash: str) -> ProblemKey:
        return ProblemKey(gpu=self.gpu.name, device_name=device_name, arch=self.gpu.arch.value,
                          cuda_version=cuda_version, sms=self.gpu.sms,
                          template_hash=template_hash, n=self.n, m=self.m, vec=self.vec,
                          dtype="f32", a_layout=self.a_layout.value, rows=self.rows,
                          cols=self.cols, depth=self.depth)


# ------------------------------------------------------------------ search space
def _tiles(task: TuneTask) -> tuple[str, ...]:
    return tuple(t.value for t in ATile) if task.a_layout is ALayout.ROW_MAJOR else ("tk",)


def suggest_config(trial: optuna.Trial, task: TuneTask) -> KernelConfig | None:
    """The trial's configuration, or ``None`` where the parameters break a rule."""
    params = {
        "warp": trial.suggest_categorical("warp", [f"{a}x{b}" for a, b in WARP_LAYOUTS]),
        "ms": trial.suggest_categorical("ms", MS_CHOICES),
        "ns": trial.suggest_categorical("ns", NS_CHOICES),
        "ks_windows": trial.suggest_categorical("ks_windows", KS_WINDOW_CHOICES),
        "mt": trial.suggest_categorical("mt", MT_CHOICES),
        "nt": trial.suggest_categorical("nt", NT_CHOICES),
        "packing": trial.suggest_categorical("packing", (False, True)),
        "stages": trial.suggest_categorical("stages", STAGE_CHOICES),
        "split_k": trial.suggest_categorical("split_k", SPLIT_K_CHOICES),
        "a_tile": trial.suggest_categorical("a_tile", _tiles(task)),
    }
    return _from_params(task, params)


def params_of(config: KernelConfig) -> dict:
    """Optuna parameters that reproduce ``config`` (for enqueueing seeds)."""
    return {"ms": config.ms, "ns": config.ns, "ks_windows": config.ks // config.m,
            "mt": config.mt, "nt": config.nt, "warp": f"{config.warp_m}x{config.warp_n}",
            "packing": config.packing, "stages": config.stages, "split_k": config.split_k,
            "a_tile": config.a_tile.value}


def in_space(config: KernelConfig) -> bool:
    return (config.ks // config.m in KS_WINDOW_CHOICES and config.split_k in SPLIT_K_CHOICES
            and config.ms in MS_CHOICES and config.ns in NS_CHOICES)


def _from_params(task: TuneTask, params: dict) -> KernelConfig | None:
    warp_m, warp_n = (int(x) for x in params["warp"].split("x"))
    return try_config(task.problem, ms=params["ms"], ns=params["ns"],
                      ks=task.m * params["ks_windows"], mt=params["mt"], nt=params["nt"],
                      warp_m=warp_m, warp_n=warp_n, packing=params["packing"],
                      stages=params["stages"], split_k=params["split_k"],
                      a_tile=params["a_tile"])


def _tell(study: optuna.Study, trial: optuna.Trial, value: float, violation: float) -> None:
    """Report a result; ``violation > 0`` marks it infeasible (a constraint, not a failure)."""
    trial.set_constraint("valid", violation)
    trial.set_user_attr("violation", violation)
    study.tell(trial, value)


def model_seeds(task: TuneTask, count: int) -> list[KernelConfig]:
    """The model's best feasible configurations (split-K 1 and the best split)."""
    candidates = list(enumerate_configs(task.problem))
    if task.a_layout is ALayout.ROW_MAJOR:  # 4-byte transposing loads: rarely the best
        candidates = [c for c in candidates if c.a_tile is ATile.M_MAJOR] or candidates
    ranked = rank(candidates, task.gpu, task.rows, task.cols, task.depth)
    seeds: list[KernelConfig] = []
    shapes_seen: set[tuple] = set()
    for _, config in ranked:  # one warp layout per tile shape: diverse seeds
        shape = (config.ms, config.ns, config.ks, config.mt, config.nt, config.packing,
                 config.stages, config.a_tile)
        if shape not in shapes_seen:
            shapes_seen.add(shape)
            seeds.append(config)
        if len(seeds) == count:
            break
    if seeds:
        base = params_of(seeds[0])
        splits = [c for s in SPLIT_K_CHOICES[1:]
                  if (c := _from_params(task, {**base, "split_k": s})) is not None]
        best_split = rank(splits, task.gpu, task.rows, task.cols, task.depth)
        if best_split and best_split[0][0] < ranked[0][0]:
            seeds.insert(1, best_split[0][1])
    return seeds[:count]


# ------------------------------------------------------------------ running
@dataclass
class TuneReport:
    task: TuneTask
    trials: int
    measured: int
    winner: Winner | None
    seconds: float
    statuses: dict[str, int] = field(default_factory=dict)


@dataclass
class Tuner:
    engine: Engine
    storage_url: str
    trials: int = 40
    batch: int = 8
    workers: int = 8
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)
    _compile_pool: Any = None

    def tune(self, task: TuneTask, time_budget_s: float = math.inf) -> TuneReport:
        from .dispatch import template_hash
        from .gpu.launch import Kernel, device_info
        from .gpu.measure import RTOL, ProblemBench
        start = time.monotonic()
        info = device_info()
        key = task.key(info.name, info.cuda_version, template_hash())
        study = self._study(task, key)
        bench = ProblemBench(task.n, task.m, task.vec, task.a_layout, task.rows, task.cols,
                             task.depth)
        seen: dict[str, tuple[float, float]] = {}  # config name → (value, violation)
        for t in study.get_trials(deepcopy=False):
            if t.state == optuna.trial.TrialState.COMPLETE and "config" in t.user_attrs:
                seen[t.user_attrs["config"]] = (t.value, t.user_attrs.get("violation", 0.0))
        statuses: dict[str, int] = {}
        measured = 0
        batches = 0
        # The first batch (the model's seeds) always runs: every shape gets a winner, even
        # when setting the problem up used its share of the budget.
        while (self._done(study) < self.trials
               and (batches == 0 or time.monotonic() - start < time_budget_s)):
            batches += 1
            asked = [study.ask() for _ in range(min(self.batch,
                                                    self.trials - self._done(study)))]
            configs = [suggest_config(t, task) for t in asked]
            fresh = [c for c in configs if c is not None and feasible(c, task.gpu) is None
                     and c.name not in seen]
            errors = dict(e.split(": ", 1) for e in self._pool().compile(fresh))
            for trial, config in zip(asked, configs, strict=True):
                if config is None or feasible(config, task.gpu) is not None:
                    _tell(study, trial, INFEASIBLE_MS, 1.0)
                    statuses[TrialStatus.INFEASIBLE] = statuses.get(
                        TrialStatus.INFEASIBLE, 0) + 1
                    continue
                trial.set_user_attr("config", config.name)
                if config.name in seen:  # the sampler repeated itself: reuse the result
                    _tell(study, trial, *seen[config.name])
                    continue
                model_ms = estimate(config, task.gpu, task.rows, task.cols,
                                    task.depth).time_ms
                status, value, error = self._measure(config, errors.get(config.name),
                                                     bench, Kernel, RTOL)
                measured += status == TrialStatus.OK
                statuses[status] = statuses.get(status, 0) + 1
                seen[config.name] = (value, 0.0 if status == TrialStatus.OK else 1.0)
                _tell(study, trial, *seen[config.name])
                record_trial(self.engine, key, config, template_hash(), status,
                             value if status == TrialStatus.OK else None, model_ms, error)
        winners = best_per_problem(self.engine, key)
        winner = winners.get((task.rows, task.cols, task.depth))
        report = TuneReport(task, self._done(study), measured, winner,
                            time.monotonic() - start, statuses)
        self.log(f"{task.study_name}: {report.trials} trials ({measured} measured now), "
                 + (f"best {winner.time_ms:.4f} ms {winner.config.name}" if winner
                    else "no correct kernel"))
        return report

    def _pool(self):
        from .gpu.timing import CompilePool

        if self._compile_pool is None:
            self._compile_pool = CompilePool(self.workers)
        return self._compile_pool

    def close(self) -> None:
        if self._compile_pool is not None:
            self._compile_pool.close()

    @staticmethod
    def _measure(config, compile_error, bench, kernel_cls, rtol):
        if compile_error is not None:
            return TrialStatus.COMPILE_ERROR, INFEASIBLE_MS, compile_error
        try:
            kernel = kernel_cls(config)
            err = bench.error(kernel)
            if not err < rtol:
                return TrialStatus.WRONG, INFEASIBLE_MS, f"relative error {err:.3g}"
            return TrialStatus.OK, bench.time_ms(kernel), None
        except Exception as exc:  # a kernel that fails to launch is a result, not a crash
            return TrialStatus.LAUNCH_ERROR, INFEASIBLE_MS, f"{type(exc).__name__}: {exc}"

    def _study(self, task: TuneTask, key: ProblemKey) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=SEEDS_FROM_MODEL)
        study = optuna.create_study(study_name=task.study_name, storage=self.storage_url,
                                    sampler=sampler, direction="minimize",
                                    load_if_exists=True)
        tuned = [w.config for s, w in sorted(best_per_problem(self.engine, key).items())
                 if s != (task.rows, task.cols, task.depth)]
        neighbours = sorted(tuned, key=lambda c: c.name)[:SEEDS_FROM_TUNED]
        for config in model_seeds(task, SEEDS_FROM_MODEL) + neighbours:
            if in_space(config):
                study.enqueue_trial(params_of(config), skip_if_exists=True)
        return study

    @staticmethod
    def _done(study: optuna.Study) -> int:
        return sum(t.state == optuna.trial.TrialState.COMPLETE
                   for t in study.get_trials(deepcopy=False))


def dry_run(task: TuneTask, top: int, compile_top: bool = True) -> list[dict]:
    """Rank by the model and compile the top configurations with nvcc (no GPU needed)."""
    from concurrent.futures import ThreadPoolExecutor

    from .codegen import render
    from .compile import compile_with_nvcc

    seeds = model_seeds(task, top)
    rows = [{"config": c.name, "model_ms": estimate(c, task.gpu, task.rows, task.cols,
                                                    task.depth).time_ms} for c in seeds]
    if compile_top:
        with ThreadPoolExecutor(max_workers=4) as pool:  # nvcc runs as a child process
            compiled = list(pool.map(lambda c: compile_with_nvcc(render(c)), seeds))
        for row, config, result in zip(rows, seeds, compiled, strict=True):
            res = result.resources[config.name]
            row.update(registers=res.registers, spills=res.spill_stores + res.spill_loads)
    return rows
