"""The measurement inside a script's process (`ScriptProbe`), driven by scripted events: a clock the test
moves, an exit that records instead of ending the process, real tensors and real result files. What
each ending writes (the meter's windows, a crash, a stall, a timeout, torchpace's own failure) is
decided here, without starting a script."""

import json
import os

import pytest
import torch

from torchpace.measure.timing import WARMUP_SHARE
from torchpace.protocol import CRASH, INVALID, OK, TIMEOUT, TrialResult
from torchpace.script.inprocess import HookReport
from torchpace.script.probe import NO_STEP_MESSAGE, ScriptProbe
from torchpace.script.spec import OWN_FAILURE, OWN_FAILURE_EXIT, STEPS_SUFFIX, ScriptMeasure

BATCH = 8
WAIT_S, COMPUTE_S = 0.002, 0.008  # each scripted step: this long in the DataLoader, this long computing


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Script:
    """A training loop's events as the hooks report them, on a clock the test moves."""

    def __init__(self, tmp_path, report=None, **spec):
        self.clock, self.exits = Clock(), []
        self.spec = ScriptMeasure(result_path=str(tmp_path / "result.json"), command=("python", "train.py"), **spec)
        self.probe = ScriptProbe(self.spec, report or HookReport(), clock=self.clock, exit=self.exits.append)
        self.losses: list[float] = []
        self.optimizer = object()
        self.probe.on_optimizer_built()

    def step(self, compute_s=COMPUTE_S):
        self.clock.now += WAIT_S
        self.probe.on_batch(torch.zeros(BATCH, 3), WAIT_S)
        self.clock.now += compute_s
        loss = torch.tensor(1.0 / (len(self.losses) + 1))
        self.losses.append(float(loss))
        self.probe.on_backward(loss)
        self.probe.on_optimizer_step(self.optimizer)

    def run_until_it_ends(self, limit=100_000):
        for _ in range(limit):
            if self.probe.finished:
                return
            self.step()
        raise AssertionError("the measurement never ended")

    def result(self) -> TrialResult:
        with open(self.spec.result_path) as f:
            return TrialResult.from_dict(json.load(f))


def test_a_steady_script_is_measured_after_its_first_step_and_its_process_ends_with_the_result(tmp_path):
    script = Script(tmp_path, max_time_s=10.0, target_ci_rel=0.05, guard_steps=3)
    script.run_until_it_ends()
    result = script.result()
    assert script.exits == [0] and result.status == OK
    throughput = result.bench.throughput
    assert throughput.stopped_by == "ci" and throughput.windows >= 6
    assert throughput.samples_per_s == pytest.approx(BATCH / (WAIT_S + COMPUTE_S))
    assert result.bench.input_bound_frac == pytest.approx(WAIT_S / (WAIT_S + COMPUTE_S))
    assert result.bench.step.batch_size == BATCH and result.bench.script.samples_source == "dataloader"
    assert result.bench.script.steps_seen == script.probe.steps and result.bench.script.step_source == "optimizer"
    assert result.guard_losses == pytest.approx(script.losses[:3])
    assert list(result.bench.loss_values) == pytest.approx(script.losses)
    # the steps file the parent reads when a script ends without letting the hook write its result
    assert int((tmp_path / ("result.json" + STEPS_SUFFIX)).read_text()) == script.probe.steps
    # steps after the end (a script's other threads) change nothing
    script.step()
    assert script.exits == [0] and script.result() == result


def test_the_first_step_is_not_timed(tmp_path):
    script = Script(tmp_path, max_time_s=10.0, target_ci_rel=0.05)
    script.step(compute_s=20.0)  # imports, compile, worker start-up
    script.run_until_it_ends()
    result = script.result()
    assert result.status == OK and result.bench.throughput.samples_per_s == pytest.approx(BATCH / (WAIT_S + COMPUTE_S))
    assert result.wall_time_s > 20.0 > result.bench.throughput.warmup_s


def test_a_script_that_ends_before_two_measured_windows_is_a_crash_saying_how_far_it_got(tmp_path):
    script = Script(tmp_path, max_time_s=10.0)
    for _ in range(3):
        script.step()
    script.probe.on_exit()  # atexit: the script's loop ended
    result = script.result()
    assert result.status == CRASH and script.exits == []  # the script is exiting by itself
    assert result.ended_after["steps"] == 3 and result.ended_after["windows"] == 0
    assert "ended after 3 step(s)" in result.error and "at least 2 needed" in result.error


def test_a_script_that_ends_after_measured_windows_leaves_them_marked_as_ended_by_the_script(tmp_path):
    script = Script(tmp_path, max_time_s=60.0, target_ci_rel=0.0)  # the CI can never end it
    while len(script.probe.meter.windows if script.probe.meter else ()) < 3:
        script.step()
    script.probe.on_exit()
    result = script.result()
    assert result.status == OK and result.bench.throughput.stopped_by == "script-ended"
    assert result.bench.script.ended_early and result.ended_after["windows"] == 3


def test_a_script_that_stops_stepping_ends_as_stalled_with_what_was_measured(tmp_path):
    script = Script(tmp_path, max_time_s=60.0, target_ci_rel=0.0)
    while len(script.probe.meter.windows if script.probe.meter else ()) < 3:
        script.step()
    script.probe.check_stall()
    assert not script.probe.finished  # a step's gap is not a stall
    script.clock.now += 29.0
    script.probe.check_stall()
    assert not script.probe.finished  # under the 30 s a stall needs
    script.clock.now += 2.0
    script.probe.check_stall()
    result = script.result()
    assert script.exits == [0] and result.status == OK and result.bench.throughput.stopped_by == "script-stalled"


def test_a_script_stalled_before_two_windows_is_a_timeout_naming_the_stall(tmp_path):
    script = Script(tmp_path, max_time_s=60.0)
    for _ in range(3):
        script.step()
    script.clock.now += 31.0
    script.probe.check_stall()
    result = script.result()
    assert script.exits == [0] and result.status == TIMEOUT
    assert "made no step for 31 s after step 3" in result.error and "0 window(s)" in result.error


def test_past_the_time_cap_a_short_pause_ends_the_measurement(tmp_path):
    script = Script(tmp_path, max_time_s=4.0, target_ci_rel=0.0)
    # the meter looks at its deadline when a window closes (0.1 s windows here): the script pauses mid-window
    n = 0
    while script.probe.meter is None or script.clock() < script.probe.meter.deadline - 0.05:
        script.step(compute_s=COMPUTE_S * (1 + 0.03 * (n % 7)))  # windows that differ: the CI never ends it
        n += 1
    script.clock.now += 1.5
    script.probe.check_stall()
    assert not script.probe.finished and script.clock() > script.probe.meter.deadline
    script.clock.now += 1.0
    script.probe.check_stall()
    # the time cap ended the measurement with the windows it had: not a stall (a script past its last step is
    # often just ending: evaluating, saving a checkpoint)
    assert script.exits == [0] and script.result().bench.throughput.stopped_by == "time"


def test_no_step_in_time_is_a_timeout_saying_what_a_step_is(tmp_path):
    script = Script(tmp_path, no_step_timeout_s=5.0)
    script.probe.on_no_step()
    result = script.result()
    assert script.exits == [0] and result.status == TIMEOUT
    assert NO_STEP_MESSAGE in result.error and "waited 5 s" in result.error


def test_the_no_step_watchdog_leaves_a_script_that_stepped_alone(tmp_path):
    script = Script(tmp_path)
    script.step()
    script.probe.on_no_step()
    assert script.exits == [] and not os.path.exists(script.spec.result_path)


def test_the_scripts_own_exception_is_its_crash_and_leaves_no_partial_result(tmp_path):
    script = Script(tmp_path, max_time_s=60.0, target_ci_rel=0.0)
    while len(script.probe.meter.windows if script.probe.meter else ()) < 3:
        script.step()
    script.probe.script_raised()
    script.probe.on_exit()
    assert script.exits == [] and not os.path.exists(script.spec.result_path)


def test_torchpaces_own_failure_is_labelled_as_its_own(tmp_path, capsys):
    script = Script(tmp_path)
    script.step()
    script.probe.fail_own(KeyError("planted"))
    result = script.result()
    assert script.exits == [0] and result.status == CRASH and result.error.startswith(OWN_FAILURE)
    assert "KeyError" in capsys.readouterr().err
    script.probe.fail_own(KeyError("again"))  # once only
    assert script.exits == [0]


def test_torchpaces_own_failure_that_cannot_write_a_result_says_so_in_its_exit_status(tmp_path):
    script = Script(tmp_path / "gone")  # no such folder: the result cannot be written
    script.probe.fail_own(RuntimeError("planted"))
    assert script.exits == [OWN_FAILURE_EXIT]


def test_a_knob_the_script_never_met_makes_the_trial_invalid(tmp_path):
    report = HookReport(config={"optimizer.impl": "foreach"})  # the script built no torch.optim optimizer
    script = Script(tmp_path, report, max_time_s=10.0, target_ci_rel=0.05)
    script.run_until_it_ends()
    result = script.result()
    assert script.exits == [0] and result.status == INVALID and result.error.startswith("optimizer.impl: ")


def test_a_script_without_an_optimizer_steps_at_each_backward_and_without_batches_in_steps(tmp_path):
    clock, exits = Clock(), []
    spec = ScriptMeasure(result_path=str(tmp_path / "r.json"), max_time_s=10.0, target_ci_rel=0.05)
    probe = ScriptProbe(spec, HookReport(), clock=clock, exit=exits.append)
    while not probe.finished:
        clock.now += 0.01
        probe.on_backward(torch.tensor(0.5))
    with open(spec.result_path) as f:
        result = TrialResult.from_dict(json.load(f))
    assert exits == [0] and result.bench.script.step_source == "backward" and result.bench.script.samples_source is None
    assert result.bench.throughput.samples_per_s is None and result.bench.throughput.steps_per_s == pytest.approx(100.0)


@pytest.mark.parametrize("batches_per_epoch", [6, 7])
def test_a_loader_that_reads_a_batch_ahead_counts_the_batches_each_step_used(tmp_path, batches_per_epoch):
    """accelerate's DataLoaderShard (under every Hugging Face Trainer) reads the next batch before it yields
    one, to know where an epoch ends: an epoch's first step has read one batch more than it used, its last
    one fewer. Each step counts the batches it used (2 micro-batches; an odd epoch ends on a step of one,
    as the Trainer's does), so every window of steps of 2 batches counts 2 a step, wherever it starts."""
    script = Script(tmp_path, max_time_s=10.0, target_ci_rel=0.01)
    probe, clock = script.probe, script.clock
    used, counted = [], []  # per step: the samples it used, and those the probe counted for it

    def base_loader():  # the DataLoader's own iterator, where the hook counts what is read
        for _ in range(batches_per_epoch):
            clock.now += WAIT_S
            probe.on_batch(torch.zeros(BATCH, 3), WAIT_S)
            yield BATCH

    def one_ahead():  # DataLoaderShard.__iter__
        batches = base_loader()
        current = next(batches)
        for following in batches:
            yield current
            current = following
        yield current

    while not probe.finished:
        step = 0
        for index, batch in enumerate(one_ahead()):
            clock.now += COMPUTE_S
            probe.on_backward(torch.tensor(1.0))
            step += batch
            if index % 2 == 1 or index == batches_per_epoch - 1:
                probe.on_optimizer_step(script.optimizer)
                used.append(step)
                counted.append(probe.last_step_samples)
                step = 0
            if probe.finished:
                break
    assert counted == used and set(used) == ({2 * BATCH} if batches_per_epoch % 2 == 0 else {BATCH, 2 * BATCH})
    throughput = script.result().bench.throughput
    if batches_per_epoch % 2 == 0:  # every window counts 2 batches a step: samples/s is steps/s x 2 batches
        windows = list(zip(throughput.window_samples_per_s, throughput.window_steps_per_s))
        assert len(windows) >= 6 and [samples / steps for samples, steps in windows] == pytest.approx([2 * BATCH] * len(windows))
        assert throughput.samples_per_s == pytest.approx(2 * BATCH * throughput.steps_per_s)


@pytest.mark.parametrize("warmup_s", [None, 4.0])
def test_a_warm_up_of_its_own_cap_runs_past_its_share_of_a_short_measurement(tmp_path, warmup_s):
    # a separate run of a comparison measures a sixth of the time (here 1 s) and warms up as a whole trial would:
    # a step that takes about 1.3 s to settle converges within 4 s, never within 40% of 1 s
    script = Script(tmp_path, max_time_s=1.0, target_ci_rel=0.0, warmup_s=warmup_s)  # no CI ends it: the time does
    steps = 0
    while not script.probe.finished and steps < 10_000:
        script.step(compute_s=COMPUTE_S + 0.5 * 0.6 ** steps)
        steps += 1
    throughput = script.result().bench.throughput
    assert throughput.warmup_converged is (warmup_s is not None)
    measured_s = throughput.measured_steps * (WAIT_S + COMPUTE_S)
    if warmup_s is not None:  # then it measures the settled step, for as long as a run of 1 s measures: 60% of it
        assert WARMUP_SHARE * 1.0 < throughput.warmup_s < warmup_s  # past its share of the 1 s
        assert throughput.samples_per_s == pytest.approx(BATCH / (WAIT_S + COMPUTE_S), rel=0.05)
        assert throughput.windows >= 6 and 0.5 < measured_s < 0.7


# ---- compile time is never a stall ---------------------------------------------------------------------


def _compile_mode_report(knob="compile.mode") -> HookReport:
    """What the hook reports once `compile.mode` compiled the model in place after the first backward(), with
    the first compiled forward and backward still to come (`ScriptCompile` fields, no torch.compile run)."""
    from torchpace.script.compile import ScriptCompile

    report = HookReport(config={knob: "default"})
    compiled = report.compiled = ScriptCompile("default", report, knob)
    compiled.triggered, compiled.modules = True, ["ResNet"]
    report.reached.add(knob)
    return report


def test_a_first_compiled_step_longer_than_the_stall_floor_is_waited_for_within_the_compile_allowance(tmp_path):
    """`compile.mode`: the step after the first one compiles (64 s for a ResNet on a CPU host): not a stall, the
    meter starts once it is over, and that step's time does not stretch what counts as a stall afterwards."""
    report = _compile_mode_report()
    script = Script(tmp_path, report, max_time_s=10.0, target_ci_rel=0.05, compile_allowance_s=300.0)
    script.step()  # eager; its backward() compiled the model in place
    script.probe.on_compile_start()  # the first compiled forward: dynamo traces and inductor compiles
    for _ in range(int(64 / 0.25)):
        script.clock.now += 0.25
        script.probe.check_stall()
        assert not script.probe.finished, f"cut as a stall {script.clock.now - 100:.0f} s into the compile"
    script.probe.on_compile_end()
    report.compiled.compiled_calls, report.compiled.warm = 1, True  # the backward after it: compiling is over
    script.step()
    assert script.probe.meter is not None  # the measurement starts after the compiled step
    assert script.probe.longest_step_s < 1.0  # the compile is not a step time
    script.run_until_it_ends()
    result = script.result()
    assert result.status == OK and result.bench.throughput.stopped_by == "ci"
    assert result.bench.throughput.samples_per_s == pytest.approx(BATCH / (WAIT_S + COMPUTE_S))


def test_torchpaces_compile_is_waited_for_even_where_torch_reports_no_compile_events(tmp_path):
    """Between the first backward() (the model compiled in place) and the backward() after the first compiled
    forward, the script is compiling whatever torch's compile callbacks say (older torch has none for a
    lazily compiled backward)."""
    report = _compile_mode_report()
    script = Script(tmp_path, report, max_time_s=10.0, target_ci_rel=0.05, compile_allowance_s=300.0)
    script.step()
    script.clock.now += 120.0
    script.probe.check_stall()
    assert not script.probe.finished
    script.clock.now += 181.0  # past the allowance: a compile that hangs is still ended, saying so
    script.probe.check_stall()
    result = script.result()
    assert script.exits == [0] and result.status == TIMEOUT
    assert "compiling" in result.error and "compile allowance of 300 s" in result.error


def test_a_compile_that_hangs_is_ended_past_the_allowance_with_a_message_that_says_it_was_compiling(tmp_path):
    # a script that compiles itself recompiles after its first steps (a new input shape)
    script = Script(tmp_path, max_time_s=60.0, target_ci_rel=0.0, compile_allowance_s=120.0)
    for _ in range(3):
        script.step()
    script.probe.on_compile_start()
    script.clock.now += 119.0
    script.probe.check_stall()
    assert not script.probe.finished
    script.clock.now += 2.0
    script.probe.check_stall()
    result = script.result()
    assert result.status == TIMEOUT and "compiling" in result.error and "121 s" in result.error


def test_time_spent_compiling_is_left_out_of_a_gap_but_a_stall_after_it_is_still_one(tmp_path):
    script = Script(tmp_path, max_time_s=600.0, target_ci_rel=0.0, compile_allowance_s=300.0)  # far from its cap
    while len(script.probe.meter.windows if script.probe.meter else ()) < 3:
        script.step()
    script.probe.on_compile_start()  # a recompile inside the windows
    script.clock.now += 50.0
    script.probe.on_compile_end()
    script.clock.now += 20.0  # 70 s since the last step, 20 s of them not compiling: not a stall yet
    script.probe.check_stall()
    assert not script.probe.finished
    script.clock.now += 11.0  # 31 s not compiling: the script stopped stepping
    script.probe.check_stall()
    result = script.result()
    assert result.status == OK and result.bench.throughput.stopped_by == "script-stalled"


def test_torch_tells_the_probe_while_it_compiles_a_forward_and_a_backward_compiled_when_first_called(tmp_path):
    """Real torch.compile (an eager-running backend, to be quick): while the compiler runs, for the forward and
    for the backward torch compiles when it is first called, the probe knows it is compiling; after it, that it
    is not, and the seconds spent are counted out of the gaps."""
    import time

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from torchpace.script.hook import watch_compiles

    spec = ScriptMeasure(result_path=str(tmp_path / "r.json"), compile_allowance_s=300.0)
    probe = ScriptProbe(spec, HookReport(), exit=lambda status: None)
    seen = []

    def compiler(name):
        def compile_graph(gm, example_inputs):
            seen.append((name, probe.compiling_for(time.perf_counter())))
            return make_boxed_func(gm.forward)
        return compile_graph

    torch._dynamo.reset()  # (which also drops every compile callback)
    unwatch = watch_compiles(probe)
    assert unwatch is not None  # this torch reports its compiles
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        model.forward = torch.compile(model.forward, backend=aot_autograd(fw_compiler=compiler("forward"),
                                                                          bw_compiler=compiler("backward")))
        model(torch.randn(4, 8)).sum().backward()
        assert probe.compiles.since is None and probe.compiling_for(time.perf_counter()) is None
        spent = probe.compiles.total_s()
        model(torch.randn(4, 8)).sum().backward()  # compiled already: no compile
        assert probe.compiles.total_s() == spent > 0
    finally:
        unwatch()
        torch._dynamo.reset()
    assert [name for name, _ in seen] == ["forward", "backward"]
    assert all(compiling is not None and compiling >= 0 for _, compiling in seen)



# ---- a short script's slow steps and its end are no stall ----------------------------------------------


def test_past_the_time_cap_a_slow_step_before_any_step_time_is_known_is_no_stall(tmp_path):
    """A measurement sized to a short script in a quiet moment (1.5 s) while its steps now take 2-6 s: after its
    first step nothing tells how long one takes, so a step that outlasts the cap is waited for, not called stalled
    ("no step for 2 s after step 1")."""
    script = Script(tmp_path, max_time_s=1.5, target_ci_rel=0.0, guard_steps=0)
    script.step()  # the meter starts
    for _ in range(int(6.0 / 0.25)):  # the second step takes 6 s
        script.clock.now += 0.25
        script.probe.check_stall()
        assert not script.probe.finished, f"ended {script.clock.now - 100:.2f} s in"
    script.step(compute_s=0.0)
    n = 0
    while not script.probe.finished and n < 40:
        script.step(compute_s=2.0 + (n % 3))  # slow steps: the cap ends the measurement at a window's end
        n += 1
    result = script.result()
    assert "made no step" not in result.error and result.bench is None or \
        result.bench.throughput.stopped_by not in ("script-stalled",)
