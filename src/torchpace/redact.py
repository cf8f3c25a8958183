"""Secrets never reach an output: `redact(text)` masks them in every message, file and stream torchpace writes.

What is masked (`***` in place of the secret):

- the password of every URL, whatever the driver: `scheme://user:PASSWORD@host` (the password may hold
  `@`, `:` or `/`, as drivers accept; it runs to the last `@` before the URL's query);
- a secret given as a key: `?password=...` and `&sslpassword=...` in a URL's query, a keyword DSN
  (`host=h password=... dbname=d`, also `password='a b'`), `PASSWORD: ...` and `"password": "..."`;
- every secret torchpace was handed in a URL (`remember_secrets`), wherever it shows up later and in any
  spelling: as given, percent-decoded (`p%40ss` is `p@ss` in a driver's error) and percent-encoded.

`redacting_streams()` puts `redact` between torchpace and its stdout/stderr for a whole command (the
CLI's errors, tables, `--json`, notices, logs); the file writers (`torchpace.files`) redact the text they
write (torchpace.toml, JSON results, the HTML report, traces). This module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import re
import sys
from typing import Any, Iterator
from urllib.parse import quote, unquote

MASK = "***"
# keys whose values are secrets, in URL queries, keyword DSNs, JSON and env-style text
_SECRET_KEYS = r"password|passwd|pwd|sslpassword|pgpassword|secret|secret_key|api_key|apikey|access_token|auth_token|token"
_URL = re.compile(r"\b[a-zA-Z][\w+.-]*://[^\s'\"<>]+")
_KEYED = re.compile(rf"(?i)(?<![\w-])((?:{_SECRET_KEYS})[\"']?\s*[=:]\s*)(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[^\s&;,'\"<>)}}\]]+)")
_MIN_REMEMBERED = 4  # shorter secrets are masked where they stand (URL, key), not wherever such letters appear
_remembered: set[str] = set()


def redact(text: str) -> str:
    """`text` with every secret masked (see the module docstring)."""
    if not text:
        return text
    text = _URL.sub(lambda m: _redact_url_token(m.group(0)), text)
    text = _KEYED.sub(lambda m: m.group(1) + _masked_value(m.group(2)), text)
    for secret in sorted(_remembered, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_url(url: str) -> str:
    """A database or service URL as messages and files may show it: its secrets masked."""
    remember_secrets(url)
    return redact(url)


def remember_secrets(url: str) -> None:
    """Remember the secrets in `url` (its password, secret query values) in every spelling, so that
    `redact` masks them wherever they show up later (a driver's error quotes the decoded password)."""
    for secret in _url_secrets(url):
        for spelling in {secret, unquote(secret), quote(unquote(secret), safe="")}:
            if len(spelling) >= _MIN_REMEMBERED:
                _remembered.add(spelling)


def redact_data(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings) with `redact` applied to every string in it."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_data(item) for item in value)
    return value


def _url_secrets(url: str) -> list[str]:
    """The raw (as written) password and secret query values of `url`."""
    match = _URL.search(url)
    if match is None:
        return [m.group(2).strip("'\"") for m in _KEYED.finditer(url)]
    found = []
    userinfo, _ = _split_authority(match.group(0).partition("://")[2])
    if userinfo is not None and ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    return found + [m.group(2).strip("'\"") for m in _KEYED.finditer(url)]


def _split_authority(rest: str) -> tuple[str | None, str]:
    """(userinfo or None, what follows it) of a URL after `scheme://`: the userinfo ends at the last
    `@` before the query or fragment."""
    query = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, query)
    return (None, rest) if at < 0 else (rest[:at], rest[at:])


def _redact_url_token(token: str) -> str:
    scheme, _, rest = token.partition("://")
    userinfo, after = _split_authority(rest)
    if userinfo is not None and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:{MASK}{after}"
    return f"{scheme}://{rest}"


def _masked_value(value: str) -> str:
    """The mask, keeping the quotes a quoted value had (so JSON and TOML stay valid)."""
    return f"{value[0]}{MASK}{value[0]}" if value[:1] in ("'", '"') else MASK


class RedactingStream:
    """A text stream that masks secrets in everything written to it; everything else is the stream's own."""

    def __init__(self, stream: Any):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def redacting_streams() -> Iterator[None]:
    """Within the block, what goes to `sys.stdout` and `sys.stderr` (as text) is redacted."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


__all__ = ["MASK", "redact", "redact_url", "redact_data", "remember_secrets", "RedactingStream", "redacting_streams"]
