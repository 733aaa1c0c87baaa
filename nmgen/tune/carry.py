"""Tuned records that outlive a change of the code generator.

Problems are keyed on their family's generator hash (its templates and the module of its
template arguments: ``Family.generator_hash``), so any edit of them orphans the family's
records. Yet a change often leaves most kernels' source as it was
(a new parameter at its default renders the old code byte for byte): a record of such a
kernel still times the code that the current generator builds. ``carry`` renders every
recorded configuration with the generator that made the records (its source tree, e.g. a
git revision, in a process of its own) and with the current one, and re-keys the trials
of the kernels whose source is identical; the others are dropped, to be tuned again.
With ``top``, the report also names, per problem, the changed kernels among its ``top``
fastest: ``Tuner.remeasure`` times those again (``nmgen carry --remeasure TOP``), so that
a generator change costs minutes of GPU time rather than a new search.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ..codegen import VERSION_LINE, render, source_hash
from ..families.base import Config
from ..families.registry import all_families, config_from_dict
from ..store.records import ProblemKey, config_row, get_or_create
from ..store.tables import GOOD, ConfigRow, ProblemRow, TrialRow

# Run in the old tree's process: its own nmgen (an editable install of this checkout
# would otherwise answer for the templates), every configuration rendered, hashes out:
# the source hash as ``codegen.source_hash`` takes it (without the version line), by the
# generator of the tree's layout (families, or the single FP32 template before them).
_RENDER_SCRIPT = """
import hashlib, json, re, sys
sys.meta_path = [f for f in sys.meta_path
                 if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path.insert(0, sys.argv[1])
version_line = re.compile(sys.argv[2], re.MULTILINE)
from nmgen.codegen import render
try:
    from nmgen.families.registry import all_families, config_from_dict
    generators = {f.name: f.generator_hash() for f in all_families()}
except ImportError:
    from nmgen.config import KernelConfig
    from nmgen.dispatch import template_hash
    config_from_dict, generators = KernelConfig.from_dict, {"f32": template_hash()}
out = {}
for params in json.load(sys.stdin):
    config = config_from_dict(params)
    code = version_line.sub("", render(config).code, count=1)
    out[config.name] = hashlib.sha256(code.encode()).hexdigest()
json.dump({"generators": generators, "sources": out}, sys.stdout)
"""


def render_hashes(root: Path, params: Iterable[dict]) -> tuple[dict[str, str], dict[str, str]]:
    """({family: generator hash}, {kernel name: source hash}) of the generators in source
    tree ``root`` (a checkout of nmgen)."""
    done = subprocess.run([sys.executable, "-c", _RENDER_SCRIPT, str(root),
                           VERSION_LINE.pattern],
                          input=json.dumps(list(params)), capture_output=True, text=True,
                          cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"rendering with the generator in {root} failed:\n{done.stderr}")
    answer = json.loads(done.stdout)
    return answer["generators"], answer["sources"]


def tree_of_revision(repo: Path, revision: str, dest: Path) -> Path:
    """The source tree of ``revision`` of the git repository ``repo``, written to ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", revision, "nmgen"]
                             + (["templates"] if _has_path(repo, revision, "templates") else []),
                             capture_output=True)
    if archive.returncode:
        said = archive.stderr.decode(errors="replace").strip().splitlines()
        raise ValueError(f"--from-rev {revision}: git cannot read nmgen/ of it in {repo} "
                         f"({said[-1] if said else f'exit {archive.returncode}'})")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def _has_path(repo: Path, revision: str, path: str) -> bool:
    """Whether ``revision`` has ``path`` (older trees kept the templates at the top)."""
    return subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{revision}:{path}"],
                          capture_output=True).returncode == 0


@dataclass
class CarryReport:
    generators: dict[str, str]  # the current families' generator hashes, by family
    problems: int = 0  # problems of other generators
    carried: int = 0  # trials re-keyed
    dropped: int = 0  # trials of kernels whose source changed
    changed: set[str] = field(default_factory=set)  # those kernels' names
    # per problem (its key under the current generator): changed kernels among its fastest
    remeasure: dict[ProblemKey, list[Config]] = field(default_factory=dict)

    def __str__(self) -> str:
        current = ", ".join(f"{f} {h[:12]}" for f, h in sorted(self.generators.items()))
        return (f"{self.problems} problems of an older generator: {self.carried} trials "
                f"carried to the current generators ({current}), {self.dropped} dropped "
                f"({len(self.changed)} kernels whose source changed)")


def carry(engine: Engine, old_root: Path, top: int = 0,
          patterns: Collection[tuple[int, int]] | None = None) -> CarryReport:
    """Re-key the records that an older generator (source tree ``old_root``) made and the
    current one would make alike; remove that generator's problems afterwards. With
    ``top``, list each problem's changed kernels among its ``top`` fastest results in
    ``report.remeasure``. ``patterns`` ((n, m) pairs) limits the carry to those patterns'
    problems; the others wait for a later carry. Raises ``ValueError`` where the records
    were made by a generator other than ``old_root``'s."""
    report = CarryReport({f.name: f.generator_hash() for f in all_families()})
    with Session(engine) as session, session.begin():
        old = [p for p in session.scalars(select(ProblemRow).where(
            ProblemRow.template_hash.not_in(list(report.generators.values()))))
            if patterns is None or (p.n, p.m) in patterns]
        if not old:
            return report
        params = {row.name: row.params for row in session.scalars(
            select(ConfigRow).join(TrialRow, TrialRow.config_id == ConfigRow.id)
            .where(TrialRow.problem_id.in_([p.id for p in old])))}
        old_generators, old_sources = render_hashes(old_root, params.values())
        family_of_hash = {h: f for f, h in old_generators.items() if f in report.generators}
        foreign = {p.template_hash for p in old} - set(family_of_hash)
        if foreign:
            known = ", ".join(f"{f} {h[:12]}" for f, h in sorted(old_generators.items()))
            raise ValueError(f"records of generator(s) {sorted(h[:12] for h in foreign)}; "
                             f"the tree {old_root} has {known}")
        same = {}
        for name, p in params.items():
            source = render(config_from_dict(p))
            if source_hash(source.code) == old_sources[name]:
                same[name] = source
            else:
                report.changed.add(name)
        report.problems = len(old)
        for problem in old:
            generator = report.generators[family_of_hash[problem.template_hash]]
            _carry_problem(session, problem, same, generator, report)
            if top > 0:
                _list_changed_finalists(session, problem, same, top, generator, report)
        _drop(session, [p.id for p in old])
    return report


def _carry_problem(session: Session, problem: ProblemRow, same: dict, generator: str,
                   report: CarryReport) -> None:
    target = get_or_create(session, ProblemRow, gpu_id=problem.gpu_id,
                            template_hash=generator, n=problem.n, m=problem.m,
                            vec=problem.vec, dtype=problem.dtype, a_layout=problem.a_layout,
                            rows=problem.rows, cols=problem.cols, depth=problem.depth)
    held = set(session.scalars(select(ConfigRow.name).join(
        TrialRow, TrialRow.config_id == ConfigRow.id).where(TrialRow.problem_id == target.id)))
    for trial in session.scalars(select(TrialRow).where(TrialRow.problem_id == problem.id)):
        name = trial.config_row.name
        if name not in same:
            report.dropped += 1
            continue
        if name in held:  # already measured under the current generator: that one stands
            continue
        source = same[name]
        session.add(TrialRow(problem_id=target.id,
                             config_id=config_row(session, source.config, source.sha256).id,
                             status=trial.status, time_ms=trial.time_ms, tflops=trial.tflops,
                             model_ms=trial.model_ms, error=trial.error,
                             created=trial.created))
        report.carried += 1


def _list_changed_finalists(session: Session, problem: ProblemRow, same: dict, top: int,
                            generator: str, report: CarryReport) -> None:
    good = sorted((trial.time_ms, trial.config_row.name, trial.config_row.params)
                  for trial in session.scalars(select(TrialRow).where(
                      TrialRow.problem_id == problem.id, TrialRow.status.in_(GOOD))))
    changed = [config_from_dict(params) for _, name, params in good[:top]
               if name not in same]
    if changed:
        report.remeasure[ProblemKey.of_row(problem, generator)] = changed


def _drop(session: Session, problem_ids: list[int]) -> None:
    """The older generator's problems, their trials and the configurations left unused."""
    session.execute(delete(TrialRow).where(TrialRow.problem_id.in_(problem_ids)))
    session.execute(delete(ProblemRow).where(ProblemRow.id.in_(problem_ids)))
    used = select(TrialRow.config_id)
    session.execute(delete(ConfigRow).where(ConfigRow.id.not_in(used)))
