"""The tuning strategies, each one object: greedy (the default, `torchpace.tune.policy`) and Optuna's own
samplers (`tpe`, `random`, `grid`), which serve to compare strategies.

A strategy owns what differs between them: its Optuna sampler, how the baseline comes to be measured
(greedy's policy proposes it; Optuna's samplers are handed it as the study's first trial), what a trial
runs (its `Assignment`: greedy pins one on each trial, and a tuner whose every pending trial is running
elsewhere waits for one) and with which config (greedy's as its policy made it, where a knob set to its
default replaces a script's own setting; a search's, the values its sampler suggested), what a new study
records of it (`study_attrs`), and the replay of a study into decisions (greedy's `GreedyState`; None for a
search that decides nothing step by step). The study loop (`torchpace.tune.tuner`) asks its strategy and
runs what it says through the one trial executor (`torchpace.tune.executor`); nothing outside
`make_strategy` looks at a strategy's name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Callable

from torchpace.errors import UsageError
from torchpace.tune.attrs import ATTR, Assignment, StudyAttrs, TrialRecord
from torchpace.tune.handle import StudyHandle
from torchpace.tune.policy import GREEDY_REVISION, GreedyState, Proposal, guard_scatter
from torchpace.tune.space import KnobSpace
from torchpace.tune.study import fail_stale_trials

_log = logging.getLogger(__name__)

STRATEGIES = ("greedy", "tpe", "random", "grid")
_WAIT_POLL_S = 2.0  # how often a waiting tuner looks for a free trial


class Strategy:
    """What the study loop asks of a strategy (see the module docstring).

    Attributes:
        name: as `--strategy` names it.
        space: the knobs it searches (`tune.space.KnobSpace`).
        study_attrs: what a new study of it records besides its name (`StudyAttrs` fields).
        keeps_final_time: the budget keeps the time of a final comparison with the defaults back from the
            candidates compared after a config was kept (`TrialExecutor.keep_final_time`).
        guard_scatter: the convergence guard's absolute tolerance widens to the baseline curve's own scatter
            (`tune.guard.check_guard`): in every study but a greedy one tuned before revision 6.
    """

    name: str = ""
    space: list[KnobSpace]
    study_attrs: Mapping[str, Any] = {}
    keeps_final_time: bool = False  # the executor keeps the final comparison's time back from candidates
    guard_scatter: bool = True

    @property
    def sampler(self):
        """The Optuna sampler the study is opened with."""
        raise NotImplementedError

    def begin(self, study) -> None:
        """Before the loop's first trial (a new or resumed `study`)."""

    def assignment(self, study, number: int, deadline: float, on_wait: Callable[[], None]) -> Assignment:
        """What trial `number` of `study` is to run; `action` `done` when nothing is left (or, waiting, the
        monotonic `deadline` passed). `on_wait` is called each time it waits for another tuner."""
        raise NotImplementedError

    def config(self, assignment: Assignment, suggested: Mapping[str, Any]) -> dict[str, Any]:
        """The config trial's `assignment` runs, from the values its sampler `suggested` for every knob: the knobs
        set away from their defaults."""
        return {k.name: suggested[k.name] for k in self.space if suggested[k.name] != k.default}

    def replay(self, trials: list) -> GreedyState | None:
        """The decisions `trials` (Optuna's) replay to; None for a strategy that decides nothing step by step."""
        return None

    def done(self, trials: list) -> bool:
        """Whether nothing is left to run (every decision taken, or a failed baseline): never for a search."""
        return False


class GreedyStrategy(Strategy):
    """Greedy: one knob at a time from the incumbent, every decision a paired comparison (`tune.policy`),
    through `GreedySampler`. A study tuned before (before paired comparisons, or under an earlier revision
    of the policy: `stored`) is replayed and resumed with the policy it was tuned with.

    Args:
        budget_short: the tune's judgement of its budget (`executor.Budget.short_of`).
    """

    name = "greedy"
    study_attrs = {"paired": True, "greedy_revision": GREEDY_REVISION}

    def __init__(self, space: list[KnobSpace], conflicts: Callable[[dict], str | None], handle: StudyHandle | None,
                 stored: StudyAttrs | None = None, budget_short: Callable[[Proposal, list], bool] | None = None):
        # lazy: optuna (hundreds of ms) loads only when a study is opened (the sampler is Optuna's class)
        from torchpace.tune.sampler import GreedySampler

        paired, revision = (stored.paired, stored.greedy_revision) if stored is not None else (True, GREEDY_REVISION)
        self.space, self.handle = space, handle
        self.keeps_final_time = paired and revision >= 5  # since revision 5; a study tuned before goes on as it was
        self.guard_scatter = guard_scatter(paired, revision)
        self._sampler = GreedySampler(space, conflicts, handle, paired=paired, revision=revision,
                                      budget_short=budget_short)

    @property
    def sampler(self):
        return self._sampler

    def assignment(self, study, number: int, deadline: float, on_wait: Callable[[], None]) -> Assignment:
        """The proposal the sampler pinned on the trial, waiting while other tuners hold every pending trial
        (a killed tuner's trial is failed meanwhile, then run again)."""
        while True:
            frozen = self.handle.trial(number)
            assignment = TrialRecord.from_trial(frozen).assignment
            if assignment.action != "wait":
                return assignment
            if time.monotonic() >= deadline:
                return replace(assignment, action="done")
            on_wait()
            time.sleep(_WAIT_POLL_S)
            fail_stale_trials(study, self.handle)
            self._sampler.assign(study, frozen)

    def config(self, assignment: Assignment, suggested: Mapping[str, Any]) -> dict[str, Any]:
        """The proposal's config as the policy made it (the suggested values are the same knobs' values): a value
        equal to a knob's default is kept there where it replaces a script's own setting."""
        return dict(assignment.config)

    def replay(self, trials: list) -> GreedyState:
        return self._sampler.plan(trials)

    def done(self, trials: list) -> bool:
        """Every knob decided, or the final comparison run early for the budget, or a failed baseline."""
        state = self.replay(trials)
        return state.done or bool(state.failed_baseline)


class OptunaStrategy(Strategy):
    """One of Optuna's own samplers over the same space, each trial one config measured alone; the defaults
    are enqueued as the study's first trial (the baseline)."""

    def __init__(self, name: str, make_sampler: Callable[[], Any], space: list[KnobSpace], handle: StudyHandle | None):
        self.name, self._make_sampler, self.space, self.handle = name, make_sampler, space, handle
        self._sampler = None

    @property
    def sampler(self):
        if self._sampler is None:
            self._sampler = self._make_sampler()
        return self._sampler

    def begin(self, study) -> None:
        if study.get_trials(deepcopy=False):
            return
        defaults = {k.name: k.default for k in self.space}
        study.enqueue_trial(defaults, user_attrs={ATTR: Assignment(slot="baseline", kind="baseline").to_attrs()})

    def assignment(self, study, number: int, deadline: float, on_wait: Callable[[], None]) -> Assignment:
        return TrialRecord.from_trial(self.handle.trial(number)).assignment


def check_strategy(name: str) -> None:
    """UsageError naming the valid strategies for an unknown `name`."""
    if name not in STRATEGIES:
        raise UsageError(f"--strategy {name!r} is not valid; valid strategies: {', '.join(STRATEGIES)}")


def make_strategy(name: str, space: list[KnobSpace], conflicts: Callable[[dict], str | None] = lambda config: None,
                  seed: int = 0, handle: StudyHandle | None = None, stored: StudyAttrs | None = None,
                  budget_short: Callable[[Proposal, list], bool] | None = None) -> Strategy:
    """The strategy `name` over `space`: the one place a strategy's name is read.

    Args:
        handle: the study it tunes (None: it only replays one, as a report does).
        stored: the study's metadata, when the study exists: greedy goes on with the policy it was tuned with.
        budget_short: greedy: the tune's judgement of its budget (`executor.Budget.short_of`).
    """
    check_strategy(name)
    if name == "greedy":
        return GreedyStrategy(space, conflicts, handle, stored, budget_short)
    # lazy: optuna (hundreds of ms) loads only when a study is opened
    import optuna

    samplers = {"tpe": lambda: optuna.samplers.TPESampler(seed=seed),
                "random": lambda: optuna.samplers.RandomSampler(seed=seed),
                "grid": lambda: optuna.samplers.GridSampler({k.name: list(k.values) for k in space}, seed=seed)}
    return OptunaStrategy(name, samplers[name], space, handle)
