"""Tuned records that outlive a change of the code generator.

Problems are keyed on the generator's hash (the template and ``codegen.py``), so any edit
of either orphans every record. Yet a change often leaves most kernels' source as it was
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

from .codegen import render
from .config import KernelConfig
from .db import GOOD, ConfigRow, ProblemKey, ProblemRow, TrialRow, _get_or_create, config_row
from .dispatch import template_hash

# Run in the old tree's process: its own nmgen (an editable install of this checkout
# would otherwise answer for the templates), every configuration rendered, hashes out.
_RENDER_SCRIPT = """
import json, sys
sys.meta_path = [f for f in sys.meta_path
                 if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path.insert(0, sys.argv[1])
from nmgen.codegen import render
from nmgen.config import KernelConfig
from nmgen.dispatch import template_hash
out = {}
for params in json.load(sys.stdin):
    config = KernelConfig.from_dict(params)
    out[config.name] = render(config).sha256
json.dump({"generator": template_hash(), "sources": out}, sys.stdout)
"""


def render_hashes(root: Path, params: Iterable[dict]) -> tuple[str, dict[str, str]]:
    """(generator hash, {kernel name: source sha256}) of the generator in source tree
    ``root`` (a checkout of nmgen: ``nmgen/`` and ``templates/``)."""
    done = subprocess.run([sys.executable, "-c", _RENDER_SCRIPT, str(root)],
                          input=json.dumps(list(params)), capture_output=True, text=True,
                          cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"rendering with the generator in {root} failed:\n{done.stderr}")
    answer = json.loads(done.stdout)
    return answer["generator"], answer["sources"]


def tree_of_revision(repo: Path, revision: str, dest: Path) -> Path:
    """The source tree of ``revision`` of the git repository ``repo``, written to ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", revision, "nmgen",
                              "templates"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


@dataclass
class CarryReport:
    generator: str  # the current generator's hash, which the carried records now bear
    problems: int = 0  # problems of other generators
    carried: int = 0  # trials re-keyed
    dropped: int = 0  # trials of kernels whose source changed
    changed: set[str] = field(default_factory=set)  # those kernels' names
    # per problem (its key under the current generator): changed kernels among its fastest
    remeasure: dict[ProblemKey, list[KernelConfig]] = field(default_factory=dict)

    def __str__(self) -> str:
        return (f"{self.problems} problems of an older generator: {self.carried} trials "
                f"carried to {self.generator[:12]}, {self.dropped} dropped "
                f"({len(self.changed)} kernels whose source changed)")


def carry(engine: Engine, old_root: Path, top: int = 0,
          patterns: Collection[tuple[int, int]] | None = None) -> CarryReport:
    """Re-key the records that an older generator (source tree ``old_root``) made and the
    current one would make alike; remove that generator's problems afterwards. With
    ``top``, list each problem's changed kernels among its ``top`` fastest results in
    ``report.remeasure``. ``patterns`` ((n, m) pairs) limits the carry to those patterns'
    problems; the others wait for a later carry. Raises ``ValueError`` where the records
    were made by a generator other than ``old_root``'s."""
    report = CarryReport(template_hash())
    with Session(engine) as session, session.begin():
        old = [p for p in session.scalars(select(ProblemRow).where(
            ProblemRow.template_hash != report.generator))
            if patterns is None or (p.n, p.m) in patterns]
        if not old:
            return report
        params = {row.name: row.params for row in session.scalars(
            select(ConfigRow).join(TrialRow, TrialRow.config_id == ConfigRow.id)
            .where(TrialRow.problem_id.in_([p.id for p in old])))}
        generator, old_sources = render_hashes(old_root, params.values())
        foreign = {p.template_hash for p in old} - {generator}
        if foreign:
            raise ValueError(f"records of generator(s) {sorted(h[:12] for h in foreign)}; "
                             f"the tree {old_root} is generator {generator[:12]}")
        same = {}
        for name, p in params.items():
            source = render(KernelConfig.from_dict(p))
            if source.sha256 == old_sources[name]:
                same[name] = source
            else:
                report.changed.add(name)
        report.problems = len(old)
        for problem in old:
            _carry_problem(session, problem, same, report)
            if top > 0:
                _list_changed_finalists(session, problem, same, top, report)
        _drop(session, [p.id for p in old])
    return report


def _carry_problem(session: Session, problem: ProblemRow, same: dict, report: CarryReport
                   ) -> None:
    target = _get_or_create(session, ProblemRow, gpu_id=problem.gpu_id,
                            template_hash=report.generator, n=problem.n, m=problem.m,
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
                            report: CarryReport) -> None:
    good = sorted((trial.time_ms, trial.config_row.name, trial.config_row.params)
                  for trial in session.scalars(select(TrialRow).where(
                      TrialRow.problem_id == problem.id, TrialRow.status.in_(GOOD))))
    changed = [KernelConfig.from_dict(params) for _, name, params in good[:top]
               if name not in same]
    if changed:
        report.remeasure[ProblemKey.of_row(problem, report.generator)] = changed


def _drop(session: Session, problem_ids: list[int]) -> None:
    """The older generator's problems, their trials and the configurations left unused."""
    session.execute(delete(TrialRow).where(TrialRow.problem_id.in_(problem_ids)))
    session.execute(delete(ProblemRow).where(ProblemRow.id.in_(problem_ids)))
    used = select(TrialRow.config_id)
    session.execute(delete(ConfigRow).where(ConfigRow.id.not_in(used)))
