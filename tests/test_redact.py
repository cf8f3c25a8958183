"""One masking function for every output (`torchpace.redact`): every URL form the database drivers
accept, keyword DSNs, and a secret seen once wherever it shows up again, in any spelling."""

from __future__ import annotations

import io
import sys

import pytest

from torchpace.redact import MASK, RedactingStream, redact, redact_data, redact_url, remember_secrets

# (text, the secret that must not survive, what must stay readable)
CASES = {
    "user:password@host": ("postgresql://tuner:hunter22@db.lan:5432/studies", "hunter22", "tuner:***@db.lan:5432/studies"),
    "a driver in the scheme": ("postgresql+psycopg://tuner:hunter22@db/s", "hunter22", "postgresql+psycopg://tuner:***@db/s"),
    "@ and : in the password": ("mysql://tuner:p@ss:w0rd@db/s", "p@ss:w0rd", "tuner:***@db/s"),
    "/ in the password": ("postgresql://tuner:a/b/c9@db/s", "a/b/c9", "tuner:***@db/s"),
    "percent-encoded": ("postgresql://tuner:p%40ss%20word@db/s", "p%40ss%20word", "tuner:***@db/s"),
    "?password=": ("postgresql://tuner@db/s?password=hunter22&sslmode=require", "hunter22", "sslmode=require"),
    "&sslpassword=": ("postgresql://tuner@db/s?sslmode=verify-full&sslpassword=keypass9", "keypass9", "sslmode=verify-full"),
    "query only": ("postgresql:///s?host=db&user=tuner&password=hunter22", "hunter22", "user=tuner"),
    "keyword DSN": ("host=db port=5432 user=tuner password=hunter22 dbname=s", "hunter22", "dbname=s"),
    "quoted keyword DSN": ("host=db password='hunt er22' dbname=s", "hunt er22", "dbname=s"),
    "JSON": ('{"user": "tuner", "password": "hunter22"}', "hunter22", '"password": "***"'),
    "in a sentence": ("cannot connect to mysql://root:hunter22@10.0.0.5/x (timeout)", "hunter22", "(timeout)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_form_of_a_secret_is_masked(case):
    text, secret, kept = CASES[case]
    shown = redact(text)
    assert secret not in shown and MASK in shown and kept in shown, shown


def test_a_secret_handed_over_once_is_masked_wherever_it_shows_up_in_any_spelling():
    remember_secrets("postgresql://tuner:s%40fe%2Fkey9@db/s")
    for later in ("FATAL: password s@fe/key9 rejected", "url was s%40fe%2Fkey9", "raw s@fe%2Fkey9 is not matched"):
        assert "s@fe/key9" not in redact(later) and "s%40fe%2Fkey9" not in redact(later)
    assert redact_url("postgresql://tuner:other99@db/s") == "postgresql://tuner:***@db/s"
    assert "other99" not in redact("other99 alone")  # remembered by redact_url


def test_text_without_secrets_is_left_as_it_is():
    for text in ("sqlite:///.torchpace/studies.db", "password authentication failed for user \"tuner\"",
                 "https://github.com/pytorch/pytorch", "3 tokens: 512 samples/s", ""):
        assert redact(text) == text


def test_data_and_streams_are_masked_too():
    assert redact_data({"storage": ["mysql://u:hunter22@h/d"], "n": 3}) == {"storage": ["mysql://u:***@h/d"], "n": 3}
    buffer = io.StringIO()
    stream = RedactingStream(buffer)
    stream.write("postgresql://u:hunter22@h/d\n")
    assert buffer.getvalue() == "postgresql://u:***@h/d\n" and stream.getvalue() == buffer.getvalue()


def test_the_cli_masks_every_line_it_writes(capsys):
    from torchpace.cli import main

    # a URL whose driver is missing: the error names it, masked (and exits 2, not a ModuleNotFoundError)
    assert main(["report", "--storage", "mysql://tuner:hunter22@db/s", "-o", "r.html"]) == 2
    err = capsys.readouterr().err
    assert "hunter22" not in err and "tuner:***@db" in err and "Traceback" not in err and "mysql" in err, err
    assert not isinstance(sys.stdout, RedactingStream)  # the CLI put its streams back
