"""Secrets never reach an output: `redact(text)` masks them in every message, file and stream torchpace writes.

What is masked (`***` in place of the secret):

- the password of every URL, whatever the driver: `scheme://user:PASSWORD@host`, whatever characters it
  holds (`@`, `:`, `/`, `?`, `#`, quotes and the other sub-delimiters, raw or percent-encoded): it runs to
  the last `@` before the URL ends (at whitespace, or where the text quoting it goes on: `",` in JSON),
  also where the URL is quoted for a shell or escaped for HTML;
- a token carried by a URL: the user part of an `https://TOKEN@host` (web schemes: http, https, git, ws,
  ftp, also after `+`), and every query value whose name says it is a secret (`?token=`, `access_token`,
  `client_secret`, `X-Amz-Signature`, `sig`, `key`, ...);
- a secret given as a key: `?password=...` and `&sslpassword=...`, a keyword DSN (`host=h password=...
  dbname=d`, also `password='a b'`), `PASSWORD: ...` and `"password": "..."`;
- a secret given as a command-line option: `--password=...`, `--db-password ...`, `--hf-token ...`,
  `--api-key ...` (any option whose name holds password, passwd, pwd, passphrase, secret, token, api key,
  access key, private key or credentials as a word), its value bare or quoted, on a command line or in a
  JSON or Python list of words;
- every secret torchpace was handed (a URL or an option on its own command line: `remember_command_secrets`,
  which the CLI calls with its arguments), wherever it shows up later and in any spelling: as given,
  percent-decoded (`p%40ss` is `p@ss` in a driver's error) and percent-encoded, quoted for a shell, escaped
  in JSON or HTML.

`redacting_streams()` puts `redact` between torchpace and its stdout/stderr for a whole command (the
CLI's errors, tables, `--json`, notices, logs); the file writers (`torchpace.files`) redact the text they
write (torchpace.toml, JSON results, the HTML report, traces). This module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import html
import json
import re
import shlex
import sys
from typing import Any, Iterable, Iterator
from urllib.parse import quote, unquote

MASK = "***"
# keys whose values are secrets, in URL queries, keyword DSNs, JSON and env-style text
_SECRET_KEYS = r"password|passwd|pwd|sslpassword|pgpassword|secret|secret_key|api_key|apikey|access_token|auth_token|token"
_KEYED = re.compile(rf"(?i)(?<![\w-])((?:{_SECRET_KEYS})[\"']?\s*[=:]\s*)(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[^\s&;,'\"<>)}}\]]+)")
_SCHEME = re.compile(r"\b([a-zA-Z][\w+.-]*)://")
# where a URL ends in text: whitespace or an HTML tag; or a quote that closes it in JSON or a list (`",` `'}`)
_URL_END = re.compile(r"[\s<>]|[\"'](?=[,:}\])])")
_WEB_SCHEMES = frozenset({"http", "https", "git", "ws", "wss", "ftp", "ftps"})  # a user alone there is a token
_PORT = re.compile(r"\d*(?:[/?#]|$)")  # `host:8080/path`: a port, not a password
_QUERY_ITEM = re.compile(r"([?&;])([A-Za-z0-9_.\-]+)=([^&#\s'\"<>]*)")
_SECRET_NAME_PARTS = ("password", "passwd", "secret", "token", "apikey", "api_key", "signature", "credential")
_SECRET_NAME_WORDS = frozenset({"pwd", "pass", "key", "sig", "auth"})
# a command-line option that carries a secret, and its value: `--password=x`, `--hf-token x`, quoted for a
# shell or not; in a JSON list (`"--token",  "x"`) or a Python one (`'--token', 'x'`)
_FLAG_WORDS = r"password|passwd|pwd|passphrase|secret|token|apikey|api[-_]key|access[-_]key|private[-_]key|credentials?"
_FLAG = re.compile(rf"""(?ix)(?<![\w-])(?P<flag>--?(?:[a-z0-9]+[-_])*(?:{_FLAG_WORDS})(?:[-_][a-z0-9]+)*)
    (?: (?P<jsep>",\s*")(?P<jval>(?:[^"\\]|\\.)*)(?=")
      | (?P<psep>',\s*')(?P<pval>(?:[^'\\]|\\.)*)(?=')
      | (?P<sep>=|[ \t]+(?!-{{1,2}}[a-z]))(?P<val>'(?:[^']|'"'"')*'|"(?:[^"\\]|\\.)*"|[^\s'"]+) )""")
_FLAG_ALONE = re.compile(rf"(?i)--?(?:[a-z0-9]+[-_])*(?:{_FLAG_WORDS})(?:[-_][a-z0-9]+)*")  # its value is the next word
_MIN_REMEMBERED = 4  # shorter secrets are masked where they stand (URL, key), not wherever such letters appear
_remembered: set[str] = set()


def redact(text: str) -> str:
    """`text` with every secret masked (see the module docstring)."""
    if not text:
        return text
    text = _redact_urls(text)
    text = _KEYED.sub(lambda m: m.group(1) + _masked_value(m.group(2)), text)
    text = _FLAG.sub(_masked_flag, text)
    for secret in sorted(_remembered, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def redact_url(url: str) -> str:
    """A database or service URL as messages and files may show it: its secrets masked."""
    remember_secrets(url)
    return redact(url)


def remember_secrets(url: str) -> None:
    """Remember the secrets in `url` (its password or token, secret query values) in every spelling, so that
    `redact` masks them wherever they show up later (a driver's error quotes the decoded password)."""
    _remember(_url_secrets(url))


def remember_command_secrets(words: Iterable[str]) -> None:
    """Remember every secret on a command line (a URL's password or token, the value of a secret option, a
    `password=` key), so that `redact` masks it wherever and however it shows up later."""
    words = [str(word) for word in words]
    found = []
    for index, word in enumerate(words):
        found += _url_secrets(word)
        if _FLAG_ALONE.fullmatch(word) and index + 1 < len(words):
            found.append(words[index + 1])  # `--token VALUE`
        elif _FLAG.fullmatch(word) and "=" in word:
            found.append(word.partition("=")[2])
    _remember(found)


def redact_words(words: Iterable[str]) -> tuple[str, ...]:
    """A command line's words with their secrets masked (as `redact` masks text; the word after a secret
    option given alone, `--token VALUE`, is masked whole): the command as a file or a database may keep it."""
    words = [str(word) for word in words]
    masked = []
    for index, word in enumerate(words):
        after_flag = index > 0 and _FLAG_ALONE.fullmatch(words[index - 1]) is not None
        masked.append(MASK if after_flag else redact(word))
    return tuple(masked)


def redact_data(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings) with `redact` applied to every string in it."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_data(item) for item in value)
    return value


def _remember(secrets: Iterable[str]) -> None:
    for secret in secrets:
        for raw in {secret, unquote(secret)}:
            for spelling in {raw, quote(raw, safe=""), shlex.quote(raw).strip("'"), json.dumps(raw)[1:-1], html.escape(raw)}:
                if len(spelling) >= _MIN_REMEMBERED:
                    _remembered.add(spelling)


def _url_parts(text: str) -> Iterator[tuple[str, int, int]]:
    """(scheme, start, end) of what follows `scheme://` for every URL in `text`, up to where the URL ends."""
    for match in _SCHEME.finditer(text):
        end = _URL_END.search(text, match.end())
        yield match.group(1), match.end(), end.start() if end else len(text)


def _userinfo(scheme: str, rest: str) -> tuple[str, str] | None:
    """(user, secret) of a URL's userinfo in `rest` (what follows `scheme://`), None when it carries no
    secret; the userinfo ends at the last `@` (a password may hold `@`, `/`, `?`, `#`, quotes)."""
    at = rest.rfind("@")
    if at < 0:
        return None
    userinfo = rest[:at]
    user, colon, secret = userinfo.partition(":")
    if any(c in user for c in "/?#"):  # a host and a path before an `@` in the query: no userinfo
        return None
    if colon:
        return None if _PORT.match(secret) else (user + ":", secret)
    return ("", user) if user and scheme.rpartition("+")[2].lower() in _WEB_SCHEMES else None


def _redact_urls(text: str) -> str:
    pieces, done = [], 0
    for scheme, start, end in _url_parts(text):
        if start < done:
            continue
        rest = text[start:end]
        found = _userinfo(scheme, rest)
        if found is not None:
            user, secret = found
            rest = user + MASK + rest[len(user) + len(secret):]
        rest = _QUERY_ITEM.sub(lambda m: m.group(0) if not _secret_name(m.group(2)) or not m.group(3)
                               else f"{m.group(1)}{m.group(2)}={MASK}", rest)
        pieces += [text[done:start], rest]
        done = end
    return "".join(pieces) + text[done:]


def _secret_name(name: str) -> bool:
    """Whether a query parameter's name says its value is a secret (`access_token`, `X-Amz-Signature`, `sig`)."""
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_NAME_PARTS) or bool(
        _SECRET_NAME_WORDS.intersection(re.split(r"[-_.]", lowered)))


def _url_secrets(url: str) -> list[str]:
    """The raw (as written) password or token and secret query values of the URLs in `url`."""
    found = [m.group(2).strip("'\"") for m in _KEYED.finditer(url)]
    for scheme, start, end in _url_parts(url):
        rest = url[start:end]
        userinfo = _userinfo(scheme, rest)
        if userinfo is not None:
            found.append(userinfo[1])
        found += [m.group(3) for m in _QUERY_ITEM.finditer(rest) if _secret_name(m.group(2)) and m.group(3)]
    return found


def _masked_flag(match: re.Match) -> str:
    if match.group("jsep") is not None:
        return f"{match.group('flag')}{match.group('jsep')}{MASK}"
    if match.group("psep") is not None:
        return f"{match.group('flag')}{match.group('psep')}{MASK}"
    return f"{match.group('flag')}{match.group('sep')}{_masked_value(match.group('val'))}"


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


__all__ = ["MASK", "redact", "redact_url", "redact_data", "remember_secrets", "remember_command_secrets", "redact_words",
           "RedactingStream",
           "redacting_streams"]
