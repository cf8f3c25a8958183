"""`precision.amp = fp16` in an unmodified script (`torchpace.script.scaler`): the GradScaler placed from
outside gives, step for step, what the hand-written AMP recipe gives, and refuses where it cannot be
placed safely. Run on the CPU, whose autocast and GradScaler take fp16 too (the knob itself asks for CUDA)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


def _record(child_env, mode: str, loop: str) -> dict:
    result = subprocess.run([sys.executable, str(SCRIPTS / "scaler_record.py"), mode, loop], env=child_env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "stderr": result.stderr}


@pytest.mark.parametrize("loop", ["plain", "clip", "closure", "inf", "two", "accumulate"])
def test_the_scaler_from_outside_trains_exactly_as_the_hand_written_recipe(loop, child_env):
    hook, hand = _record(child_env, "hook", loop), _record(child_env, "hand", loop)
    assert hook["inner"] == ["torch.float16"] and hook["dtypes"] == hand["dtypes"]  # fp16 inside, float32 out
    assert hook["reached"] == ["precision.amp"] and hook["refused"] is None
    assert hook["checksum"] == hand["checksum"]  # the same parameters after every step, skipped steps included
    assert json.dumps(hook["losses"]) == json.dumps(hand["losses"])
    if loop == "inf":  # the overflowing step was skipped and the scale backed off, as the recipe does
        assert hook["scale"] < 65536.0 and hook["losses"][3] != hook["losses"][3]  # NaN


@pytest.mark.parametrize(("loop", "why"), [
    ("own-scaler", "the script builds its own GradScaler (tests/script/scripts/scaler_record.py:"),
    ("lbfgs", "LBFGS.step() requires a closure, which it may evaluate several times per step"),
])
def test_where_a_scaler_cannot_be_placed_safely_fp16_does_not_apply_and_the_script_runs_in_float32(loop, why, child_env):
    hook = _record(child_env, "hook", loop)
    assert hook["refused"].startswith(why) and hook["not_applied"]["precision.amp"] == hook["refused"]
    assert hook["reached"] == [] and hook["inner"] == ["torch.float32"]  # autocast stopped with it
    assert "precision.amp = fp16 not applied" in hook["stderr"] and "runs in float32" in hook["stderr"]
