"""JSON schema of a bench result (`torchpace bench --json`, `BenchResult.to_dict`)."""

_NUMBER = {"type": "number"}
_OPT_NUMBER = {"type": ["number", "null"]}

BENCH_RESULT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "torchpace bench result",
    "type": "object",
    "required": [
        "kind", "schema_version", "workload", "config", "device", "batch_size", "grad_accumulation",
        "samples_per_s", "samples_per_s_ci_low", "samples_per_s_ci_high", "samples_per_s_iqr",
        "ci_rel_halfwidth", "noise_warning", "step_time_s", "windows", "measured_steps",
        "window_samples_per_s", "warmup_s", "warmup_steps", "warmup_converged", "stopped_by",
        "compute_only_samples_per_s", "input_bound_frac", "peak_memory_bytes", "peak_memory_kind",
        "loss_values", "wall_time_s", "host",
    ],
    "properties": {
        "kind": {"const": "torchpace.bench"},
        "schema_version": {"const": 1},
        "workload": {"type": "string"},
        "config": {"type": "object", "description": "knobs that differ from their defaults"},
        "device": {"type": "string"},
        "batch_size": {"type": "integer", "minimum": 1},
        "grad_accumulation": {"type": "integer", "minimum": 1},
        "samples_per_s": _NUMBER,
        "samples_per_s_ci_low": _NUMBER,
        "samples_per_s_ci_high": _NUMBER,
        "samples_per_s_iqr": _NUMBER,
        "ci_rel_halfwidth": _NUMBER,
        "noise_warning": {"type": "boolean"},
        "step_time_s": _NUMBER,
        "windows": {"type": "integer", "minimum": 1},
        "measured_steps": {"type": "integer", "minimum": 1},
        "window_samples_per_s": {"type": "array", "items": _NUMBER},
        "warmup_s": _NUMBER,
        "warmup_steps": {"type": "integer"},
        "warmup_converged": {"type": "boolean"},
        "stopped_by": {"enum": ["ci", "time"]},
        "compute_only_samples_per_s": _OPT_NUMBER,
        "input_bound_frac": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "peak_memory_bytes": {"type": "integer", "minimum": 0},
        "peak_memory_kind": {"enum": ["cuda_max_allocated", "cpu_peak_rss"]},
        "loss_values": {"type": "array", "items": _NUMBER},
        "wall_time_s": _NUMBER,
        "host": {"type": "object"},
    },
}
