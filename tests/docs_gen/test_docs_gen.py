"""The generated reference: current with the code, complete, and written only where asked."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

from torchpace.docs_gen import (
    ARCHITECTURE,
    WHERE_IS_BEGIN,
    WHERE_IS_END,
    build_architecture,
    plan_docs,
    stale_docs,
)
from torchpace.docs_gen.source import call_arguments, constants_used, field_notes

REPO = Path(__file__).resolve().parents[2]


def test_generated_reference_is_current():
    stale = stale_docs(REPO)
    assert not stale, f"generated docs are stale: {', '.join(map(str, stale))}; run `make docs` and commit them"


def _where_is_block() -> str:
    text = (REPO / ARCHITECTURE).read_text()
    return text.split(WHERE_IS_BEGIN, 1)[1].split(WHERE_IS_END, 1)[0]


def test_where_is_index_names_every_knob_check_analyzer_verdict_and_alert():
    from torchpace.doctor.checks import ALL_CHECKS
    from torchpace.knobs import REGISTRY
    from torchpace.monitor.symptoms import RULES
    from torchpace.profile.analyzers import REGISTRY as ANALYZERS
    from torchpace.profile.verdict import VerdictKind

    block = _where_is_block()
    wanted = [*(f"`{name}`" for name in REGISTRY), *(f"`{check.__name__}`" for check in ALL_CHECKS),
              *(f"`profile.{name}`" for name in ANALYZERS), *(f"`{kind.value}`" for kind in VerdictKind),
              *(f"`{rule.id}`" for rule in RULES)]
    missing = [item for item in wanted if item not in block]
    assert not missing, f"not in the where-is-X index: {missing}"
    for path in set(re.findall(r"`([a-z_/]+\.py)`", block)):
        assert (REPO / "src" / "torchpace" / path).is_file(), path


def test_doctor_reference_quotes_each_threshold_as_the_code_writes_it():
    from torchpace.doctor import checks

    page = plan_docs(REPO)[Path("docs/reference/doctor.md")]
    nofile = {c.name: c for c in constants_used(checks, "check_nofile")}
    assert set(nofile) >= {"_NOFILE_FLOOR", "_NOFILE_BASE", "_FDS_PER_BATCH"}  # helpers' constants count too
    for constant in nofile.values():
        assert f"| `{constant.name}` | `{constant.expression}` | {constant.reason} |" in page
    assert "`doctor.probe.<name>`" in page  # an f-string id shows its field


def test_knob_reference_lists_every_knob_with_its_default_and_point():
    from torchpace.knobs import REGISTRY

    page = plan_docs(REPO)[Path("docs/reference/knobs.md")]
    for knob in REGISTRY.values():
        assert f"| `{knob.name}` | `{knob.point.value}` |" in page


def test_schema_reference_lists_every_bench_and_doctor_field():
    from torchpace.doctor.schema import DOCTOR_JSON_SCHEMA
    from torchpace.measure.schema import BENCH_RESULT_SCHEMA
    from torchpace.protocol import TrialResult

    page = plan_docs(REPO)[Path("docs/reference/schemas.md")]
    for name in [*BENCH_RESULT_SCHEMA["properties"], *DOCTOR_JSON_SCHEMA["properties"], "findings[].remedy.command",
                 "verdict.knobs_to_try", *TrialResult.__dataclass_fields__]:
        assert f"| `{name}` |" in page, name


def test_build_architecture_replaces_only_the_generated_block():
    hand = "# architecture\n\nhand-written text\n"
    first = build_architecture(hand)
    assert first.startswith(hand.rstrip("\n")) and "## Where is X" in first and first.count(WHERE_IS_BEGIN) == 1
    edited = first.replace(WHERE_IS_BEGIN + "\n", WHERE_IS_BEGIN + "\nan old row\n") + "\n## Later section\n"
    again = build_architecture(edited)
    assert "an old row" not in again and again.endswith("\n## Later section\n") and again.count(WHERE_IS_END) == 1


def test_source_readers_follow_helpers_and_read_comments(tmp_path, monkeypatch):
    (tmp_path / "planted_thresholds.py").write_text(
        '_LIMIT_S = 2 * 60  # two minutes: the reason\n'
        '_UNUSED = 3\n'
        'def _helper(x):\n    return x > _LIMIT_S\n'
        'def check(facts):\n'
        '    if _helper(facts):\n        return report("area", f"area.item.{facts}")\n'
        '    return report("area", "area.plain")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    import planted_thresholds

    assert [(c.name, c.expression, c.reason) for c in constants_used(planted_thresholds, "check")] == [
        ("_LIMIT_S", "2 * 60", "two minutes: the reason")]
    assert call_arguments(planted_thresholds, "check", "report", 1) == ["area.item.<facts>", "area.plain"]
    sys.modules.pop("planted_thresholds")


def test_field_notes_prefer_the_docstring_then_the_line_comment():
    from torchpace.measure.timing import Throughput
    from torchpace.protocol import TrialResult, TrialSpec

    assert field_notes(TrialSpec)["profile"].startswith("after the bench, profile a few steps")
    assert field_notes(TrialResult)["failed_rank"] == "multi-process trials: the rank that failed first."
    assert field_notes(Throughput)["stopped_by"].startswith('"ci" when the CI target was met')  # its line's comment


def _docs_gen(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchpace.docs_gen", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=120)


def test_check_names_stale_pages_and_writes_nothing_then_make_docs_fixes_them(tmp_path):
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "reference" / "knobs.md"
    page.write_text(page.read_text().replace("`data.num_workers`", "`data.workers`"))
    (tmp_path / "docs" / "reference" / "monitor.md").unlink()
    before = page.read_text()

    check = _docs_gen(tmp_path, "--check")
    assert check.returncode == 1
    assert "stale: docs/reference/knobs.md" in check.stderr and "stale: docs/reference/monitor.md" in check.stderr
    assert page.read_text() == before

    write = _docs_gen(tmp_path)
    assert write.returncode == 0 and "wrote docs/reference/knobs.md" in write.stdout
    assert _docs_gen(tmp_path, "--check").returncode == 0
    assert not list(tmp_path.rglob(".*.tmp"))


def test_a_root_without_docs_is_exit_2_naming_it(tmp_path):
    done = _docs_gen(tmp_path)
    assert done.returncode == 2 and str(tmp_path) in done.stderr and "docs/" in done.stderr
    assert not any(tmp_path.iterdir())


def test_cli_reference_shows_every_verb_and_option_as_help_does():
    import importlib

    import click

    from torchpace.cli import _VERBS

    page = plan_docs(REPO)[Path("docs/reference/cli.md")]
    for verb, (module, summary) in _VERBS.items():
        assert f"## torchpace {verb}\n\n{summary}" in page
        for param in importlib.import_module(module).command.params:
            if isinstance(param, click.Option):
                assert f"| `{param.opts[0]}" in page or f", {param.opts[0]}" in page, (verb, param.opts)
