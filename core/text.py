"""Text that comes from outside gridgate (a CE's answer, a pilot's stderr, a feed, a file
another user wrote): parsed so that any bad document is one :class:`ValueError` of that
source, and shown so that it cannot drive the terminal or the mail reader of the person who
reads it.

:func:`parse_json` is ``json.loads`` whose every failure is a ``ValueError``: a document nested
deeper than the interpreter's recursion limit (``[[[[...`` 200,000 levels in 400 kB) raises
``RecursionError`` in ``json.loads``, which no ``except ValueError`` catches; here it is a bad
answer like any other. :func:`parse_yaml` does the same for ``yaml.safe_load``.

:func:`printable` escapes control characters (ESC, BEL, backspace, carriage return, DEL,
C1), Unicode format characters (the bidi overrides and isolates U+202A-U+202E and
U+2066-U+2069, zero-width characters, the BOM), line and paragraph separators and lone
surrogates as ``\\x1b``, ``\\u202e``..., so a pilot's stderr that clears the screen and draws
"all good" reads as the escapes it holds. The director passes every notification through it
(subject, body and the evidence a notifier renders from: command output, failure reason), and
every log line; a plugin that prints outside text itself calls it.

:func:`safe_url` is a URL as it may be printed: the password of its user info and the values
of query parameters that carry secrets (``password``, ``token``, ``access_token``,
``api_key``...) as ``***``; :func:`url_secret` says which secret a URL carries, for a config
check that refuses it and asks for a secret file instead.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any
from urllib.parse import unquote_plus

__all__ = ["SECRET_PARAMETERS", "parse_json", "parse_yaml", "printable", "safe_url", "url_secret"]

#: Query parameters whose value is a secret (compared in lower case; also any name that ends
#: in ``_token``, ``_secret``, ``_password`` or ``_key``). redis-py reads ``password`` from
#: a Redis URL's query.
SECRET_PARAMETERS = frozenset(
    {
        "password",
        "passwd",
        "pass",
        "pwd",
        "secret",
        "token",
        "auth",
        "authorization",
        "apikey",
        "api_key",
        "key",
        "sig",
        "signature",
        "x-amz-signature",
        "x-amz-credential",
    }
)
_SECRET_SUFFIXES = ("_token", "_secret", "_password", "_key", "-token", "-key")
_QUERY_PARAMETER = re.compile(r"(^|[&;])([^&;=#]+)=([^&;#]*)")

# C0 but tab and newline, DEL and C1; the format (Cf) characters of Unicode 15; U+2028/2029;
# surrogates (only in text decoded with surrogateescape or from JSON's \ud800).
_UNSAFE_CLASS = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f"
    "\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
    "\ud800-\udfff"
)
_UNSAFE = re.compile(f"[{_UNSAFE_CLASS}]")
_UNSAFE_OR_NEWLINE = re.compile(f"[{_UNSAFE_CLASS}\n\t]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if char == "\n":
        return "\\n"
    if char == "\t":
        return "\\t"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str, *, newlines: bool = True) -> str:
    """``text`` with every control, format, bidi and separator character escaped
    (``\\x1b``, ``\\u202e``); newlines and tabs are kept unless ``newlines`` is False (a
    subject, a label, one log field). Text without them is returned as it is.

    :param text: what came from outside.
    :param newlines: keep newlines and tabs (a body, a command's output).
    """
    pattern = _UNSAFE if newlines else _UNSAFE_OR_NEWLINE
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escape, text)


def parse_json(data: str | bytes | bytearray, **options: Any) -> Any:
    """``json.loads(data, **options)`` whose every failure is a :class:`ValueError`.

    :param data: the document; bytes must be UTF-8.
    :param options: passed to ``json.loads`` (``object_pairs_hook``, ``parse_constant``...).
    :raises ValueError: not JSON (``json.JSONDecodeError``), bytes that are not UTF-8, or a
        document nested deeper than the recursion limit allows (``RecursionError`` in
        ``json.loads``); the message says which.
    """
    try:
        if isinstance(data, (bytes, bytearray)):
            data = bytes(data).decode("utf-8")  # JSON between systems is UTF-8 (RFC 8259)
        return json.loads(data, **options)
    except RecursionError:
        raise ValueError(f"nested deeper than {sys.getrecursionlimit()} levels: not read") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, a document nested past the recursion limit included.

    :param text: the document.
    :raises yaml.YAMLError: not YAML (with its line and column, as ``yaml.safe_load``).
    :raises ValueError: nested deeper than the recursion limit allows.
    """
    import yaml

    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {sys.getrecursionlimit()} levels: not read") from None


def _secret_name(name: str) -> bool:
    lowered = unquote_plus(name).strip().lower()
    return lowered in SECRET_PARAMETERS or lowered.endswith(_SECRET_SUFFIXES)


def _userinfo(url: str) -> tuple[str, str, str]:
    """(scheme://, user info, the rest) of ``url``; user info is '' when there is none."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", "", url
    end = len(rest)
    for mark in "/?#":
        found = rest.find(mark)
        if found != -1:
            end = min(end, found)
    authority = rest[:end]
    info, at, _host = authority.rpartition("@")
    if not at:
        return f"{scheme}://", "", rest
    return f"{scheme}://", info, rest[len(info) + 1 :]


def url_secret(url: str) -> str:
    """What secret ``url`` carries, in words ('' when none): a password in its user info, or
    a query parameter that :data:`SECRET_PARAMETERS` names.

    :param url: any URL (redis://, https://...).
    """
    _scheme, info, rest = _userinfo(url)
    if ":" in info:
        return "a password in its user info (user:password@)"
    query = rest.partition("?")[2].partition("#")[0]
    for match in _QUERY_PARAMETER.finditer(query):
        if _secret_name(match.group(2)):
            return f"a secret in its query ({unquote_plus(match.group(2))}=...)"
    return ""


def safe_url(url: str) -> str:
    """``url`` as it may be printed or logged: the password of its user info and the values
    of secret query parameters (:data:`SECRET_PARAMETERS`) replaced by ``***``.

    :param url: any URL.
    """
    scheme, info, rest = _userinfo(url)
    if ":" in info:
        rest = f"{info.partition(':')[0]}:***@{rest}"
    elif info:
        rest = f"{info}@{rest}"
    head, mark, query = rest.partition("?")
    if mark:
        query, hash_mark, fragment = query.partition("#")

        def mask(match: re.Match[str]) -> str:
            if _secret_name(match.group(2)):
                return f"{match.group(1)}{match.group(2)}=***"
            return match.group(0)

        rest = f"{head}?{_QUERY_PARAMETER.sub(mask, query)}{hash_mark}{fragment}"
    return f"{scheme}{rest}"
