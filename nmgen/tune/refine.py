"""Variants of tuned kernels that a search does not reach on its own (a family's
``refinements``, e.g. the FP32 family's stream-K twins), proposed where the model expects
them to pay. ``nmgen refine`` times them on the GPU beside each problem's finalists, so
that the database keeps whichever is measured fastest."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from ..families.base import Config
from ..families.registry import by_generator, config_from_dict
from ..gpus import spec_or_h100
from ..store.records import ProblemKey, all_problems
from ..store.tables import GOOD


def refinement_candidates(engine: Engine, patterns: set[tuple[int, int]] | None = None,
                          top: int = 1, min_gain: float = 0.05, family_name: str | None = None
                          ) -> dict[ProblemKey, list[Config]]:
    """Problems of a current family (``family_name`` alone where given) whose ``top``
    fastest configurations have a refinement, not yet timed there, that the model
    expects ``min_gain`` faster (0: no slower)."""
    found: dict[ProblemKey, list[Config]] = {}
    for problem in all_problems(engine):
        key = problem.key
        family = by_generator(key.template_hash)
        if family is None or (patterns is not None and (key.n, key.m) not in patterns) \
                or family_name not in (None, family.name):
            continue
        good = sorted((t, name, params) for status, t, name, params, _ in problem.trials
                      if status in GOOD)
        held = {name for _, name, _ in good}
        gpu = spec_or_h100(key.gpu)
        variants = []
        for _, _, params in good[:top]:
            config = config_from_dict(params)
            baseline = family.estimate_ms(config, gpu, key.shape)
            variants += [v for v in family.refinements(config) if v.name not in held
                         and family.estimate_ms(v, gpu, key.shape) <= baseline * (1 - min_gain)]
        if variants:
            found[key] = list({v.name: v for v in variants}.values())
    return found
