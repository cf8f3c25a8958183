"""GreedySampler: the greedy policy as an Optuna sampler.

Call order (Optuna's): `before_trial` -> `infer_relative_search_space` / `sample_relative` (empty
here) -> `sample_independent` once per `trial.suggest_*` -> the objective -> `after_trial`.
`before_trial` replays the study's finished trials through `plan_greedy` and pins the next proposal
on the trial (its slot, kind and config) as system attributes; `sample_independent` answers each
knob from that proposal. A trial that finds nothing to run yet (every pending trial is in flight in
another process) is told to wait; one that finds the search complete is told it is done. The trial's
attributes are written and read through the study's `StudyHandle` (Optuna's public storage API).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Callable

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler

from torchpace.tune.attrs import Assignment, TrialRecord
from torchpace.tune.handle import StudyHandle
from torchpace.tune.policy import GREEDY_REVISION, GreedyState, Proposal, guard_scatter, plan_greedy
from torchpace.tune.space import KnobSpace
from torchpace.tune.study import build_records

_log = logging.getLogger(__name__)


class GreedySampler(BaseSampler):
    """One knob at a time from the incumbent, stage by stage (see `torchpace.tune.policy`).

    `paired` and `revision` are the study's (`StudyAttrs.paired`, `StudyAttrs.greedy_revision`): every new
    study decides by paired comparisons, with the policy's latest revision; a study tuned before is replayed
    with the policy it was tuned with. `budget_short` is the tuner's judgement of its budget, from the study's
    trials as a replay read them: True when the time left would not hold both the next proposal's comparison
    and the final one (`plan_greedy`'s `finish`); by default the budget is never short."""

    def __init__(self, space: list[KnobSpace], conflicts: Callable[[dict], str | None], handle: StudyHandle | None = None,
                 paired: bool = True, revision: int = GREEDY_REVISION,
                 budget_short: Callable[[Proposal, list], bool] | None = None):
        self.space = space
        self.conflicts = conflicts
        self.handle = handle
        self._logged_decisions = 0  # the policy's decisions already in the log (each replay repeats them all)
        self.paired = paired
        self.revision = revision
        self._logged_order = False
        self.budget_short = budget_short or (lambda proposal, trials: False)

    def plan(self, trials: list) -> GreedyState:
        """Replay `trials` (the study's, as Optuna's `FrozenTrial`s) into the policy's state; when the budget is
        short of the next candidate's comparison and the final one, the final one is next."""
        records = build_records(trials, guard_scatter(self.paired, self.revision))
        state = plan_greedy(self.space, records, self.conflicts, paired=self.paired, revision=self.revision)
        if self.paired and state.next is not None and state.next.kind == "candidate" and self.budget_short(state.next, trials):
            state = plan_greedy(self.space, records, self.conflicts, paired=True, revision=self.revision, finish=True)
        return state

    def assign(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> GreedyState:
        """Pin the next proposal (or wait/done) on `trial`; tuners sharing the study take turns here, so
        each sees the others' pins and no two take the same pending trial."""
        asked = time.monotonic()
        with self.handle.lock():
            waited_s = time.monotonic() - asked
            state = self.plan([t for t in study.get_trials(deepcopy=False) if t.number != trial.number])
            proposal: Proposal | None = state.next
            assignment = Assignment(action="run" if proposal else ("wait" if state.waiting else "done"),
                                    lock_wait_s=round(waited_s, 4))  # for `make bench-fleet`
            if proposal:
                assignment = replace(assignment, slot=proposal.slot, kind=proposal.kind, stage=proposal.stage,
                                     knob=proposal.knob, value=proposal.value, config=proposal.config,
                                     reference=proposal.reference,
                                     time_factor=proposal.time_factor if proposal.time_factor != 1 else None)
            self.handle.pin(trial.number, assignment.to_attrs())
        self._log_decisions(state)
        if assignment.action != "wait":  # a waiting tuner asks again every few seconds
            _log.debug("trial %d: %s", trial.number, f"slot {proposal.slot} ({proposal.kind})" if proposal else "the search is done")
        return state

    def _log_decisions(self, state: GreedyState) -> None:
        """Log the policy's decisions not logged yet: the stage order (and why the knobs that share cores come
        first, when they do), then each knob accepted or rejected."""
        if state.stage_order and not self._logged_order:
            _log.info("stage order: %s", " -> ".join(state.stage_order))
            if state.cores_first:
                _log.info("%s first: %s", ", ".join(state.cores_first_knobs), state.cores_first)
            self._logged_order = True
        for decision in state.decisions[self._logged_decisions:]:
            value = "" if decision.accepted_value is None else f" = {decision.accepted_value!r}"
            _log.info("%s stage, %s%s: %s", decision.stage, decision.knob, value, decision.reason)
        self._logged_decisions = max(self._logged_decisions, len(state.decisions))

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.assign(study, trial)

    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        return {}

    def sample_independent(self, study, trial, param_name: str, param_distribution: BaseDistribution) -> Any:
        config = TrialRecord.from_trial(self.handle.trial(trial.number)).assignment.config
        default = next(k.default for k in self.space if k.name == param_name)
        return config.get(param_name, default)
