"""JSON schema of a comparison (`torchpace compare --json`), derived from the records of
`torchpace.compare.result`: each field is declared once, there."""

from torchpace.compare.result import Comparison
from torchpace.records import json_schema

COMPARE_RESULT_SCHEMA = json_schema(Comparison, "torchpace comparison")
