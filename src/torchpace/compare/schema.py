"""JSON schema of a comparison (`torchpace compare --json`, `torchpace.compare.run.build_comparison`)."""

from torchpace.compare.run import RESULT_KIND, RESULT_SCHEMA_VERSION

_NUMBER = {"type": "number"}
_OPT_NUMBER = {"type": ["number", "null"]}

_ARM = {
    "type": "object",
    "required": ["config", "status", "figure", "ci_low", "ci_high", "rounds", "other_load_cores", "error"],
    "properties": {
        "config": {"type": "object", "description": "knobs that differ from their defaults"},
        "status": {"type": "string", "description": "the arm's trial status (ok, crash, oom, timeout, nonfinite, "
                                                    "invalid; partner: ended because the other arm failed, not judged)"},
        "figure": {**_OPT_NUMBER, "description": "median of this arm's rounds, in `unit`"},
        "ci_low": _OPT_NUMBER,
        "ci_high": _OPT_NUMBER,
        "rounds": {"type": "integer", "minimum": 0, "description": "measured turns (alternating) or runs (sequential)"},
        "other_load_cores": {**_OPT_NUMBER, "description": "cores other processes used during this arm's turns"},
        "error": {"type": ["string", "null"]},
        "stderr_tail": {"type": ["string", "null"]},
        "warmup_converged": {"type": ["boolean", "null"]},
    },
}

COMPARE_RESULT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "torchpace comparison",
    "type": "object",
    "required": ["kind", "schema_version", "target", "mode", "mode_reason", "unit", "stopped_by", "a", "b", "ratio",
                 "ratio_ci_low", "ratio_ci_high", "ratio_ci_coverage", "rounds", "ratios", "verdict", "summary",
                 "other_load_note", "usable_cores", "wall_time_s"],
    "properties": {
        "kind": {"const": RESULT_KIND},
        "schema_version": {"const": RESULT_SCHEMA_VERSION},
        "target": {"type": "string", "description": "the workload's name, or the script's label"},
        "mode": {"enum": ["alternating", "sequential"],
                 "description": "alternating: two processes held at once take turns; sequential: separate runs A B B A"},
        "mode_reason": {"type": ["string", "null"], "description": "why the comparison is sequential"},
        "unit": {"enum": ["samples/s", "steps/s"], "description": "steps/s when a script's samples per step are unknown"},
        "stopped_by": {"enum": ["ci", "time", "rounds", "ended", "failed"],
                       "description": "ci: the ratio's CI reached ±2%; time: --max-time; ended: a script finished first; "
                                      "failed: an arm failed"},
        "a": _ARM,
        "b": _ARM,
        "ratio": {**_OPT_NUMBER, "description": "B / A: the median of the per-round ratios (above 1: B is faster)"},
        "ratio_ci_low": {**_OPT_NUMBER, "description": "95% CI of that median (binomial order statistics)"},
        "ratio_ci_high": _OPT_NUMBER,
        "ratio_ci_coverage": {**_OPT_NUMBER, "description": "the CI's coverage (below 0.95 with fewer than 6 rounds)"},
        "rounds": {"type": "integer", "minimum": 0},
        "ratios": {"type": "array", "items": _NUMBER, "description": "each round's B / A"},
        "verdict": {"enum": ["faster", "slower", "no difference", "failed"],
                    "description": "faster: the whole CI is above 1; slower: below 1; no difference: it contains 1"},
        "summary": {"type": "string"},
        "other_load_note": {"type": ["string", "null"],
                            "description": "said when other processes' load was material during the comparison"},
        "usable_cores": {"type": ["integer", "null"]},
        "wall_time_s": _NUMBER,
    },
}
