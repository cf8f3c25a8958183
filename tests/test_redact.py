"""One masking function for every output (`torchpace.redact`): every URL form the database drivers
accept, keyword DSNs, and a secret seen once wherever it shows up again, in any spelling."""

from __future__ import annotations

import html
import io
import json
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
    # every character a password may hold, as written in a URL
    "' in the password": ("postgresql://tuner:pa'ss9@db/s", "pa'ss9", "tuner:***@db/s"),
    "' and \" in the password": ('postgresql://tuner:it\'s"q9@db:5432/s', 's"q9', "tuner:***@db:5432/s"),
    "%27 in the password": ("postgresql://tuner:pa%27ss9@db/s", "pa%27ss9", "tuner:***@db/s"),
    "every sub-delim": ("mysql://tuner:a!$&'()*+,;=b@db/s", "a!$&'()*+,;=b", "tuner:***@db/s"),
    "? and # in the password": ("postgresql://tuner:p?ss#w9@db/s", "p?ss#w9", "tuner:***@db/s"),
    "quoted for a shell": ("--db 'postgresql://tuner:pa'\"'\"'ss9@db/s' --x", "ss9@", "tuner:***@db/s"),
    "in compact JSON beside another value": ('{"a":"postgresql://tuner:hunter22@db/s","b":"x@y.z"}', "hunter22",
                                             '"b":"x@y.z"}'),
    "in HTML": ("<td>postgresql://tuner:pa&#39;ss9@db/s</td>", "ss9@", "tuner:***@db/s</td>"),
    # tokens carried by URLs
    "a token as the user": ("git clone https://ghp_abcdefGHIJ1234@github.com/org/repo.git", "ghp_abcdefGHIJ1234",
                            "***@github.com/org/repo.git"),
    "user:token": ("https://x-access-token:ghs_secretTOKEN9@github.com/o/r", "ghs_secretTOKEN9", "x-access-token:***@"),
    "signed URL": ("https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAEXAMPLE9&X-Amz-Signature=abcdef0123&x=1",
                   "abcdef0123", "x=1"),
    "client_secret and sig": ("https://h/cb?client_secret=cs-secret-9&sig=sigvalue9&state=ok", "cs-secret-9", "state=ok"),
    # secrets given as command-line options
    "--password=": ("python train.py --password=hunter22 --epochs 3", "hunter22", "--epochs 3"),
    "--password VALUE": ("python train.py --password hunter22 --epochs 3", "hunter22", "--epochs 3"),
    "--hf-token": ("python train.py --hf-token hf_abcdefSECRET --lr 0.1", "hf_abcdefSECRET", "--lr 0.1"),
    "--api_key quoted": ("python train.py --wandb_api_key='a b c9' --lr 0.1", "a b c9", "--lr 0.1"),
    "--db-password shlex-quoted": ("train.py --db-password 'it'\"'\"'s9' --lr 1", "s9'", "--lr 1"),
    "an option in a JSON list": ('"command": [\n  "--auth-token",\n  "tok-abc-999",\n  "--lr"]', "tok-abc-999", '"--lr"'),
    "an option in a Python list": ("['train.py', '--secret-key', 'sk-999999', '--lr']", "sk-999999", "'--lr'"),
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
                 "https://github.com/pytorch/pytorch", "3 tokens: 512 samples/s", "",
                 "postgresql://tuner@db:5432/s", "https://h.example/d?email=a@b.com", "https://h.example:8080/x/y",
                 "python train.py --max-tokens 512 --tokenizer_name bert-base --tokens-per-batch 9",
                 '{"a":"https://h.example/x","b":"u@h"}'):
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


def test_a_secret_remembered_from_a_command_is_masked_in_every_spelling():
    from torchpace.redact import remember_command_secrets

    remember_command_secrets(["python", "t.py", "--db", "postgresql://u:it's\"9@h/d", "--token", "tok-4242-x"])
    for later in ("the password was it's\"9", "quoted: 'it'\"'\"'s\"9'", 'json: "it\'s\\"9"', "tok-4242-x alone"):
        shown = redact(later)
        assert "it's" not in shown and "tok-4242" not in shown and 's\\"9' not in shown, shown


def test_a_command_kept_in_a_file_or_a_database_keeps_no_secret():
    from torchpace.redact import redact_words

    words = ("python", "t.py", "--token", "tok-4242-y", "--db", "postgresql://u:it's9@h/d", "--password=pw-4242", "--lr", "1")
    assert redact_words(words) == ("python", "t.py", "--token", MASK, "--db", f"postgresql://u:{MASK}@h/d",
                                   f"--password={MASK}", "--lr", "1")


# a URL and options on a script's own command line, each with a secret that must not reach any output
_SECRETS = ("pa'ss\"9", "hf_SECRETtoken42", "db-pw-4242")
_ARGS = ("--db", "postgresql://tuner:pa'ss\"9@db.invalid/s", "--hf-token", "hf_SECRETtoken42", "--db-password=db-pw-4242")


def _assert_no_secret(**outputs: str) -> None:
    for name, text in outputs.items():
        for secret in _SECRETS:
            for spelling in (secret, secret.replace("'", "'\"'\"'"), html.escape(secret), json.dumps(secret)[1:-1]):
                assert spelling not in text, f"{name} holds {secret!r}: {text[-2000:]}"


def test_launch_dry_run_shows_no_secret_of_the_command(cli_run, tmp_path):
    (tmp_path / "job.py").write_text("print('ran')\n")
    plain = cli_run("launch", "--dry-run", "--", "python", "job.py", *_ARGS)
    as_json = cli_run("launch", "--dry-run", "--json", "--", "python", "job.py", *_ARGS)
    assert plain.returncode == 0 and as_json.returncode == 0, plain.stderr + as_json.stderr
    assert "tuner:***@db.invalid" in plain.stdout and "--hf-token ***" in plain.stdout
    _assert_no_secret(stdout=plain.stdout, stderr=plain.stderr, json=as_json.stdout)


@pytest.mark.slow
def test_a_script_bench_its_json_table_and_report_show_no_secret_of_the_command(cli_run, tmp_path):
    (tmp_path / "job.py").write_text(
        "import torch\nm = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.01)\n"
        "for _ in range(100000):\n    opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()\n")
    done = cli_run("bench", "--max-time", "2", "--out", "b.json", "--", "python", "job.py", *_ARGS)
    assert done.returncode == 0, done.stderr[-3000:]
    report = cli_run("report", "b.json", "--no-doctor", "-o", "r.html")
    assert report.returncode == 0, report.stderr[-3000:]
    _assert_no_secret(stdout=done.stdout, stderr=done.stderr, out=(tmp_path / "b.json").read_text(),
                      report=(tmp_path / "r.html").read_text())
