"""Variants of tuned kernels that a tuning run did not try: each stored problem's fastest
configurations run by the stream-K grid (``KernelConfig.stream_k``), where the model expects
that to pay. ``nmgen stream-k`` times them on the GPU beside the problem's finalists, so
that the database keeps whichever is measured fastest."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from .config import ConfigError, KernelConfig
from .db import GOOD, ProblemKey, ProblemRow, TrialRow
from .dispatch import template_hash
from .model import estimate, gpu_spec


def stream_k_twin(config: KernelConfig) -> KernelConfig | None:
    """``config``'s tiles run by the stream-K grid (split-K and sliced K back to 1), or
    ``None`` where that breaks a rule."""
    try:
        return config.replace(stream_k=True, split_k=1, slice_k=1)
    except ConfigError:
        return None


def stream_k_candidates(engine: Engine, patterns: set[tuple[int, int]] | None = None,
                        top: int = 1, min_gain: float = 0.05
                        ) -> dict[ProblemKey, list[KernelConfig]]:
    """Problems of the current generator whose ``top`` fastest configurations have a
    stream-K twin, not yet timed there, that the model expects ``min_gain`` faster."""
    found: dict[ProblemKey, list[KernelConfig]] = {}
    with Session(engine) as session:
        for row in session.scalars(select(ProblemRow).where(
                ProblemRow.template_hash == template_hash())):
            if patterns is not None and (row.n, row.m) not in patterns:
                continue
            trials = session.scalars(select(TrialRow).where(TrialRow.problem_id == row.id))
            good = sorted((t.time_ms, t.config_row.name, t.config_row.params)
                          for t in trials if t.status in GOOD)
            held = {name for _, name, _ in good}
            gpu = gpu_spec(row.gpu.name)
            twins = []
            for _, _, params in good[:top]:
                config = KernelConfig.from_dict(params)
                twin = None if config.stream_k else stream_k_twin(config)
                if twin is None or twin.name in held:
                    continue
                shape = (row.rows, row.cols, row.depth)
                if (estimate(twin, gpu, *shape).time_ms
                        <= estimate(config, gpu, *shape).time_ms * (1.0 - min_gain)):
                    twins.append(twin)
            if twins:
                found[ProblemKey.of_row(row)] = twins
    return found
