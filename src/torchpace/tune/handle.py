"""One study on the storage it was opened on: what the tuner does to a trial besides what Optuna's `Study`
offers, through Optuna's public storage API only.

A sampler's `before_trial` is handed a `FrozenTrial`, and an objective an `optuna.Trial`; neither can write a
trial's system attributes, fail a trial, or be locked against another tuner. Optuna's own samplers reach
into `study._storage` and `trial._trial_id` for that. The tuner instead keeps the storage it opened itself
(`storage.open_storage`) and speaks to it through its public `BaseStorage` methods, by the study's name and
the trial's number (`StudyHandle`). Optuna's `Study` wraps that storage in a cache that keeps only
finished trials and passes every write through, so a write here is what the study reads next.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from torchpace.tune.attrs import ATTR
from torchpace.tune.storage import assignment_lock


class StudyHandle:
    """The study named `name` on `storage` (an Optuna `BaseStorage`, as `open_storage` returns it): a trial's
    system attributes pinned and read by its number, a trial failed, and the lock tuners take turns under.

    Args:
        storage: the storage the study lives on (it may not exist yet: its id is looked up when first needed).
        name: the study's name.
    """

    def __init__(self, storage: Any, name: str):
        self.storage, self.name = storage, name
        self._study_id: int | None = None
        self._trial_ids: dict[int, int] = {}  # a trial's number -> its id in the storage (fixed once made)

    @property
    def study_id(self) -> int:
        if self._study_id is None:
            self._study_id = self.storage.get_study_id_from_name(self.name)
        return self._study_id

    def trial_id(self, number: int) -> int:
        """The storage's id of the trial numbered `number` in this study."""
        if number not in self._trial_ids:
            self._trial_ids[number] = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        return self._trial_ids[number]

    def trial(self, number: int):
        """The trial numbered `number` as the storage holds it now (a `FrozenTrial`)."""
        return self.storage.get_trial(self.trial_id(number))

    def pin(self, number: int, attrs: dict[str, Any]) -> None:
        """Store `attrs` as torchpace's system attribute (`ATTR`) of trial `number`: its assignment."""
        self.storage.set_trial_system_attr(self.trial_id(number), ATTR, attrs)

    def fail(self, number: int) -> None:
        """Fail trial `number` (its tuner is gone), so that the policy runs it again.

        Raises:
            optuna.exceptions.UpdateFinishedTrialError: another tuner finished or failed it a moment ago.
        """
        # lazy: optuna (hundreds of ms) loads only when a study is opened
        from optuna.trial import TrialState

        self.storage.set_trial_state_values(self.trial_id(number), TrialState.FAIL)

    def lock(self) -> AbstractContextManager[None]:
        """The study's assignment lock (`storage.assignment_lock`): one tuner at a time chooses a trial."""
        return assignment_lock(self.storage, self.study_id)
