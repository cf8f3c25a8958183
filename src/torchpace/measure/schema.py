"""JSON schema of a bench result (`torchpace bench --json`, `BenchResult.to_dict`), derived from the
records of `torchpace.measure.result`: each field is declared once, there."""

from torchpace.measure.result import BenchResult
from torchpace.records import json_schema

BENCH_RESULT_SCHEMA = json_schema(BenchResult, "torchpace bench result")
