"""`torchpace report STUDY_OR_RESULT [-o FILE]`: one self-contained HTML report to attach to a ticket.

Thin: check the output path, read the input (a study or a result, told by its content), render,
write. Exit 0 written; 2 bad input (not a torchpace study or result, no such study, an output path
that cannot be written — checked before anything is read). The report package, matplotlib and
torch are imported only when the command runs, so `torchpace report --help` stays light.
"""

from __future__ import annotations

import click

from torchpace.cli._common import check_outputs, study_file

DEFAULT_OUT = "torchpace-report.html"


@click.command("report")
@click.argument("source", required=False, metavar="[STUDY_OR_RESULT]")
@click.option("-o", "--out", "out_path", type=click.Path(dir_okay=False), default=DEFAULT_OUT, show_default=True,
              help="Where to write the HTML report.")
@click.option("--study", "study_name", default=None,
              help="Which study in the storage (default: the only or most recently started torchpace study).")
@click.option("--storage", default=None, help="An Optuna RDB URL to read the study from, instead of a SQLite file.")
@click.option("--doctor/--no-doctor", "with_doctor", default=True, show_default=True,
              help="Run the doctor on this machine and include its findings that are not ok.")
def command(source, out_path, study_name, storage, with_doctor):
    """Write an HTML report of a tune study, a bench, compare or profile result.

    STUDY_OR_RESULT is the SQLite file `torchpace tune` writes (default: .torchpace/studies.db
    here, when it exists), a JSON file from `torchpace bench --out FILE` or `torchpace compare
    --out FILE`, or the output of
    `torchpace profile --json`. The report is one file with inline charts and styles: no
    network, nothing else to ship.
    """
    if source is None and storage is None:
        source = _default_study()
    check_outputs({"--out": out_path}, [("the input", source), ("the study storage", storage and study_file(storage))])
    # lazy: `torchpace report --help` loads this module; the verb's work loads only when it runs
    from torchpace.report import write_report
    from torchpace.report.load import load_report_data

    data = load_report_data(source, storage=storage, study=study_name)
    if data.note:
        click.echo(f"note: {data.note}", err=True)
    path = write_report(data, out_path, with_doctor=with_doctor)
    click.echo(f"wrote {path} ({path.stat().st_size / 1024:,.0f} KiB): open it in a browser, or attach it to a ticket")
    return 0


def _default_study() -> str | None:
    """The study `torchpace tune` writes in this folder by default, when it is there."""
    # lazy: `torchpace report --help` loads this module; the verb's work loads only when it runs
    from torchpace.tune.storage import DEFAULT_STUDY_FILE

    return str(DEFAULT_STUDY_FILE) if DEFAULT_STUDY_FILE.is_file() else None
