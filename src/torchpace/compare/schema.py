"""JSON schema of a comparison (`torchpace compare --json`), derived from the records of
`torchpace.measure.comparison`: each field is declared once, there."""

from torchpace.measure.comparison import Comparison
from torchpace.records import json_schema

COMPARE_RESULT_SCHEMA = json_schema(Comparison, "torchpace comparison")
