"""A study's life beside the other workers': created once (:func:`open_study`), seeded
once for all of them, and its waiting seeds given back once it is full.

A study's seeds are ranked once for all workers: the worker that creates the study
enqueues them and stores their names in it (:func:`seed_study`); the others read them
there (:func:`stored_seeds`, :func:`await_seeds`). The storages are
``nmgen.tune.storage``'s; what keeps a dead worker's trials from running for ever is
``nmgen.tune.liveness``'s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

SEEDS_ATTR = "seeds"  # a study's user attribute: the names of the configurations it starts from
SEEDS_WAIT_S = 30.0  # how long a worker waits for the seeds of a study another one created
SEEDS_POLL_S = 0.05
_ASKED_STATES = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


def open_study(name: str, storage: BaseStorage | str, sampler: optuna.samplers.BaseSampler
               ) -> tuple[optuna.Study, bool]:
    """Study ``name`` (minimised), created where it does not exist yet, and whether this
    call created it: of workers opening a new study at once, exactly one creates it."""
    try:
        return optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                   direction="minimize"), True
    except optuna.exceptions.DuplicatedStudyError:
        return optuna.load_study(study_name=name, storage=storage, sampler=sampler), False


def claim(storage: BaseStorage | str, name: str) -> bool:
    """Whether this call is the first to claim ``name``: it creates an empty study of
    that name (of workers creating one at once exactly one does, as in ``open_study``)."""
    try:
        optuna.create_study(study_name=name, storage=storage,
                            sampler=optuna.samplers.RandomSampler())
    except optuna.exceptions.DuplicatedStudyError:
        return False
    return True


def seed_study(study: optuna.Study, params: Sequence[dict], names: Sequence[str]) -> None:
    """Enqueue a new study's seeds (their parameters ``params``), then store their
    ``names`` in it: a worker that waits for the names (``await_seeds``) then finds every
    seed enqueued."""
    for values in params:
        study.enqueue_trial(values, skip_if_exists=True)
    study.set_user_attr(SEEDS_ATTR, list(names))


def stored_seeds(study: optuna.Study) -> list[str] | None:
    """The names of the configurations ``study`` was seeded with; ``None`` before its
    creator stored them."""
    names = study.user_attrs.get(SEEDS_ATTR)
    return None if names is None else [str(name) for name in names]


def await_seeds(study: optuna.Study, timeout_s: float = SEEDS_WAIT_S) -> bool:
    """Whether ``study``, created by another worker, is seeded: its seeds stored (waited
    for up to ``timeout_s`` while its creator ranks them), or trials of it asked already
    (a study seeded before seeds were stored). ``False``: its creator stopped first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if SEEDS_ATTR in study.user_attrs or study.get_trials(deepcopy=False,
                                                             states=_ASKED_STATES):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(SEEDS_POLL_S)


def give_back_waiting(study: optuna.Study, trials: int) -> int:
    """Fail, unmeasured (user attribute ``surplus``), the enqueued trials still waiting in
    a study that has its ``trials`` complete; returns how many: seeds beyond its trials (a
    study of fewer trials than seeds), or those of a worker that seeded it late, its
    creator having stopped before storing its own (``await_seeds``). Nobody asks for them
    in a full study, so they would wait for ever, and none of them can be taken
    meanwhile."""
    if len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) < trials:
        return 0
    storage = study._storage
    given = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        try:
            storage.set_trial_user_attr(trial._trial_id, "surplus", True)
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        given += 1
    return given
