"""How well each family's analytic model orders the kernels a tuned database measured, for
every problem of the families' current generators on one GPU, before and after its
calibration to the GPU's records (``nmgen.calibration``):

- within a problem: Spearman's rank correlation of the model's estimates with the measured
  times of its trials (mean over the problems with three or more), the share of its
  trials' pairs the model orders as measured (pairs within 3 % of each other left out as
  noise) and the regret of its pick (measured time of the kernel it ranks first over the
  fastest measured);
- across problems: Spearman's rank correlation of the winners' estimates with their
  measured times (does the model know which shapes are slow).

"After" numbers are held out: each problem's estimates come from a calibration fitted
without it. Two splits: by (N, K) pair (the pairs in two alternating halves, each half
estimated by the fit on the other: unseen shapes) and by pattern (each pattern and vector
length estimated by the fit on the others: what transfer to an untuned pattern meets).
The in-sample fit (every record; what dispatch uses) is shown for comparison. Then the
untuned-pattern check: each pattern held out, what dispatch would pick for its tuned
shapes from the others' records (``--transfer-stride``). With ``--exhaustive DIR`` the
FP32 family is also checked against every configuration the exhaustive tables timed
(K-major 8:32), with a calibration fitted on the records of the other patterns only.

A slimmed database (the shipped one keeps each problem's four fastest trials and its
reference kernel) shows only the top of each search. ``--floor``/``--full-warps`` evaluate
other values of the FP32 family's occupancy curve on the same records.

    python tools/model_order_check.py [--db sqlite:///nmgen/tuned_db/tuned.sqlite] [--gpu h100]
        [--exhaustive results/exhaustive_h100] [--out results/model_order_h100]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.bench.report import markdown_table  # noqa: E402
from nmgen.calibration import Calibration, Sample, fit  # noqa: E402
from nmgen.families.base import Family  # noqa: E402
from nmgen.families.f32_simt import model as f32_model  # noqa: E402
from nmgen.families.registry import all_families, get  # noqa: E402
from nmgen.gpus import GpuSpec, gpu_spec  # noqa: E402
from nmgen.store.database import connect  # noqa: E402
from nmgen.store.records import all_problems  # noqa: E402
from nmgen.store.tables import TrialStatus  # noqa: E402

NOISE = 1.03  # measured pairs closer than this are not counted


@dataclass(frozen=True)
class Measured:
    """A tuned problem's measured trials: (pattern, L, A layout) and shape, samples."""

    pattern: tuple[int, int, int]
    layout: str
    shape: tuple[int, int, int]
    samples: tuple[Sample, ...]


Predict = Callable[[Measured], np.ndarray]  # log estimates of a problem's samples


def rankdata(values: Sequence[float]) -> np.ndarray:
    """Ranks from 0, ties at their mean rank."""
    v = np.asarray(values, dtype=np.float64)
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))  # rank of each value's first
    return (first + (counts - 1) / 2.0)[inverse]


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    if len(x) < 3:
        return float("nan")
    rx, ry = rankdata(x), rankdata(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def order_stats(times: np.ndarray, predicted: np.ndarray) -> tuple[int, int, float]:
    """(concordant pairs, counted pairs, regret of the model's pick)."""
    ratio = times[:, None] / times[None, :]
    counted = ratio > NOISE  # i measured slower than j by more than the noise
    concordant = counted & (predicted[:, None] > predicted[None, :])
    return int(concordant.sum()), int(counted.sum()), float(times[np.argmin(predicted)]
                                                            / times.min())


def measured_problems(db: str, gpu: GpuSpec) -> dict[str, list[Measured]]:
    """The measured problems of every current family on ``gpu``, by "family dtype"."""
    families = {f.generator_hash(): f for f in all_families()}
    out: dict[str, list[Measured]] = defaultdict(list)
    for problem in all_problems(connect(db, writable=False)):
        key = problem.key
        family = families.get(key.template_hash)
        if family is None or key.gpu != gpu.name:
            continue
        samples = []
        for status, time_ms, _, params, _ in problem.trials:
            if status == TrialStatus.OK and time_ms:
                config = family.config_from_dict(params)
                samples.append(Sample(config, key.shape,
                                      family.estimate_ms(config, gpu, key.shape), time_ms))
        if len(samples) >= 2:
            out[f"{family.name} {key.dtype}"].append(
                Measured((key.n, key.m, key.vec), key.a_layout, key.shape, tuple(samples)))
    return out


def metrics(problems: Sequence[Measured], predict: Predict) -> dict[str, float]:
    """Within-problem and across-winner order of ``predict`` against the times."""
    within, pairs, counted, regrets, won_pred, won_time = [], 0, 0, [], [], []
    for problem in problems:
        times = np.array([s.time_ms for s in problem.samples])
        predicted = predict(problem)
        rho = spearman(predicted, times)
        if not math.isnan(rho):
            within.append(rho)
        concordant, total, regret = order_stats(times, predicted)
        pairs, counted, regrets = pairs + concordant, counted + total, [*regrets, regret]
        best = int(np.argmin(times))
        won_pred.append(float(predicted[best]))
        won_time.append(float(times[best]))
    return {"problems": len(problems), "within_spearman": float(np.mean(within)),
            "pairs_in_order": pairs / max(counted, 1), "pairs": counted,
            "regret_median": statistics.median(regrets), "regret_mean": float(np.mean(regrets)),
            "regret_max": max(regrets), "winners_spearman": spearman(won_pred, won_time)}


def raw(problem: Measured) -> np.ndarray:
    return np.log([s.estimate_ms for s in problem.samples])


def calibrated(family: Family, calibration: Calibration) -> Predict:
    def predict(problem: Measured) -> np.ndarray:
        return np.array([math.log(s.estimate_ms) + calibration.log_correction(
            family, s.config, s.shape, s.estimate_ms) for s in problem.samples])
    return predict


def held_out(family: Family, problems: Sequence[Measured],
             group: Callable[[Measured], object]) -> Predict:
    """Each problem estimated by the calibration fitted on the problems of other groups."""
    fits: dict[object, Calibration] = {}
    for g in {group(p) for p in problems}:
        fits[g] = fit(family, [s for p in problems if group(p) != g for s in p.samples])
    return lambda problem: calibrated(family, fits[group(problem)])(problem)


def shape_halves(problems: Sequence[Measured]) -> Callable[[Measured], int]:
    """Alternate (N, K) pairs in two halves."""
    pairs = sorted({p.shape[1:] for p in problems})
    half = {pair: i % 2 for i, pair in enumerate(pairs)}
    return lambda problem: half[problem.shape[1:]]


def family_rows(label: str, problems: Sequence[Measured]) -> dict[str, dict[str, float]]:
    family = get(label.split()[0])
    every = fit(family, [s for p in problems for s in p.samples])
    return {
        "model": metrics(problems, raw),
        "held out by (N, K)": metrics(problems, held_out(family, problems,
                                                          shape_halves(problems))),
        "held out by pattern": metrics(problems, held_out(family, problems,
                                                           lambda p: p.pattern)),
        "in sample": metrics(problems, calibrated(family, every)),
    }


def exhaustive_rows(folder: Path, problems: Sequence[Measured], gpu: GpuSpec) -> list[list]:
    """The FP32 family's raw and calibrated order of every configuration of the K-major
    8:32 exhaustive tables, calibrated on the records of the other patterns."""
    from nmgen.families.f32_simt import F32_SIMT
    from nmgen.tune.replay import read_tables

    tables = read_tables(sorted(folder.glob("8_32_km_full_slice*.jsonl*")))
    calibration = fit(F32_SIMT, [s for p in problems if p.pattern[:2] != (8, 32)
                                 for s in p.samples])
    rows = []
    for shape, table in sorted(tables.items()):
        names = [n for n, r in table.items() if r.status == "ok" and r.ms is not None]
        configs = [F32_SIMT.config_from_name(n) for n in names]
        times = np.array([table[n].ms for n in names])
        estimates = np.array(F32_SIMT.ranker(configs, gpu).predicted_ms(*shape))
        fixed = np.log(estimates) + np.array([calibration.log_correction(
            F32_SIMT, c, shape, e) for c, e in zip(configs, estimates, strict=True)])
        for what, predicted in (("model", np.log(estimates)), ("calibrated", fixed)):
            best_place = int(np.sum(predicted < predicted[int(np.argmin(times))])) + 1
            rows.append([f"{shape[0]}x{shape[1]}x{shape[2]}", what, len(names),
                         f"{spearman(predicted, times):.3f}",
                         f"{times[int(np.argmin(predicted))] / times.min():.3f}",
                         best_place])
    return rows


def transfer_rows(db: str, label: str, problems: Sequence[Measured], gpu: GpuSpec,
                  stride: int) -> list[list]:
    """Each pattern (and vector length, A layout) held out in turn: for every
    ``stride``-th of its tuned shapes, the kernel dispatch picks without its records
    (today's model choice; the transfer ranked by the model; ranked by the model
    calibrated without it) and the four a quick tune would time, against the kernels
    its tune measured (its four fastest and its reference kernel)."""
    from nmgen.policy import related_records
    from nmgen.problem import Problem
    from nmgen.store.records import DeviceKey, ProblemKey
    from nmgen.transfer import ranked

    name, dtype = label.split()
    family = get(name)
    engine = connect(db, writable=False)
    found: dict[str, list] = defaultdict(list)
    for layout in sorted({p.layout for p in problems}):
        patterns = sorted({p.pattern for p in problems if p.layout == layout})
        # Any of the layout's problems keys the query: it reads every pattern and shape.
        first = next(p for p in problems if p.layout == layout)
        key = ProblemKey.of(Problem(*patterns[0], layout, gpu.arch, dtype), first.shape,
                            DeviceKey(gpu.name, "", 0, 0), family)
        records = related_records(engine, key)
        for pattern in patterns:
            others = [r for r in records if (r.n, r.m, r.vec) != pattern]
            calibration = fit(family, [s for p in problems if p.pattern != pattern
                                       for s in p.samples])
            problem = Problem(*pattern, layout, gpu.arch, dtype)
            tests = [p for p in problems if p.pattern == pattern and p.layout == layout
                     and family.tunes(p.shape)]
            for measured in tests[::stride]:
                times = {s.config.name: s.time_ms for s in measured.samples}
                model = family.default_config(problem, gpu, measured.shape)
                found["model's choice"].append((times, [model.name]))
                for what, c in (("transfer, model", Calibration(family.name)),
                                ("transfer, calibrated", calibration)):
                    picks = ranked(family, problem, measured.shape, gpu, c, others)
                    found[what].append((times, [p.config.name for p in picks[:4]]))
    rows = []
    for what, cases in found.items():
        best = [min(t.values()) for t, _ in cases]
        first = [t[names[0]] / b for (t, names), b in zip(cases, best, strict=True)
                 if names[0] in t]
        quick = [min(t[n] for n in names if n in t) / b
                 for (t, names), b in zip(cases, best, strict=True)
                 if any(n in t for n in names)]
        winner = [min(t, key=t.get) in names for t, names in cases]
        rows.append([f"{label} ({len(cases)})", what, f"{len(first) / len(cases):.2f}",
                     f"{statistics.median(first):.3f} / {np.mean(first):.3f}" if first else "-",
                     f"{np.mean(winner):.2f}" if what != "model's choice" else "-",
                     f"{statistics.median(quick):.3f} / {np.mean(quick):.3f}"
                     if quick and what != "model's choice" else "-"])
    return rows


def report(results: dict[str, dict[str, dict[str, float]]], exhaustive: list[list],
           transfer: list[list], db: str, gpu: str) -> str:
    lines = [f"# Model order against {db} ({gpu}), before and after calibration\n",
             "Within a problem: mean Spearman of estimates and times over its trials, pairs "
             "ordered as measured, regret of the pick. Across problems: Spearman of the "
             "winners' estimates and times. Held-out rows estimate each problem with a "
             "calibration fitted without it (`tools/model_order_check.py`).\n"]
    rows = []
    for label, variants in sorted(results.items()):
        for variant, m in variants.items():
            rows.append([f"{label} ({m['problems']})", variant, f"{m['within_spearman']:.3f}",
                         f"{m['pairs_in_order']:.3f} of {m['pairs']}",
                         f"{m['regret_median']:.3f} / {m['regret_mean']:.3f} / "
                         f"{m['regret_max']:.3f}", f"{m['winners_spearman']:.3f}"])
    lines.append(markdown_table(
        ["family, dtype (problems)", "estimate", "within: Spearman", "within: pairs in order",
         "pick's regret (median / mean / max)", "winners: Spearman"], rows))
    if transfer:
        lines.append("\n## Untuned patterns: each pattern held out\n")
        lines.append(
            "Each pattern (with its vector length and A layout) in turn has no records; its "
            "tuned shapes (every few) are decided from the other patterns' records, the "
            "calibration fitted without it. A pick is judged only where its tune measured "
            "it (the shipped database keeps each problem's four fastest kernels and its "
            "reference): 'measured' is how often, the regret (time over the fastest "
            "measured) is over those. The quick tune's four: how often they hold the tuned "
            "winner, and the regret of the best measured among them.\n")
        lines.append(markdown_table(
            ["family, dtype (shapes)", "pick", "pick measured", "pick's regret (median / "
             "mean)", "quick four hold the winner", "quick four's regret (median / mean)"],
            transfer))
    if exhaustive:
        lines.append("\n## The FP32 family against its exhaustive tables (K-major 8:32)\n")
        lines.append("Every configuration timed on three shapes (`results/exhaustive_h100/`, "
                     "before TMA, sliced K and stream-K joined the space); the calibration is "
                     "fitted on the records of the other patterns only.\n")
        lines.append(markdown_table(
            ["shape", "estimate", "configurations", "Spearman", "pick / best",
             "measured best's place"], exhaustive))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite:///nmgen/tuned_db/tuned.sqlite")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--exhaustive", type=Path, help="the exhaustive tables' folder")
    parser.add_argument("--out", type=Path, help="write model_order.md and .json here")
    parser.add_argument("--transfer-stride", type=int, default=4, metavar="N",
                        help="untuned-pattern check on every N-th tuned shape (0: none)")
    parser.add_argument("--floor", type=float, default=f32_model.OCCUPANCY_FLOOR,
                        help="the FP32 family's occupancy floor (other values: what if)")
    parser.add_argument("--full-warps", type=float, default=f32_model.FULL_OCCUPANCY_WARPS,
                        help="the FP32 family's warps an SM at full occupancy")
    args = parser.parse_args()
    f32_model.OCCUPANCY_FLOOR, f32_model.FULL_OCCUPANCY_WARPS = args.floor, args.full_warps
    f32_model._fixed.cache_clear()
    gpu = gpu_spec(args.gpu)
    measured = measured_problems(args.db, gpu)
    results = {label: family_rows(label, problems) for label, problems in measured.items()}
    exhaustive = (exhaustive_rows(args.exhaustive, measured.get("f32 f32", []), gpu)
                  if args.exhaustive else [])
    transfer = [row for label, problems in sorted(measured.items())
                for row in (transfer_rows(args.db, label, problems, gpu, args.transfer_stride)
                            if args.transfer_stride > 0 else [])]
    text = report(results, exhaustive, transfer, args.db, args.gpu)
    print(text, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "model_order.md").write_text(text)
        (args.out / "model_order.json").write_text(json.dumps(
            {"db": args.db, "gpu": args.gpu, "families": results, "transfer": transfer,
             "exhaustive": exhaustive}, indent=1) + "\n")


if __name__ == "__main__":
    main()
