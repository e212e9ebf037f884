"""The boundary for documents from outside the process: each kind is decoded once, by one
function, into a typed value, and every way it can be wrong is one :class:`DocumentError`.

What comes from outside (a CE's JSON, a token's claims, a scheduler's table or log, a feed, a
queue's answer, a record read back from the store, a peer's heartbeat) is declared as a
`msgspec <https://jcristharif.com/msgspec/>`_ ``Struct`` (or a tuple, list or mapping of
them) and decoded with :func:`decode_json` (bytes or text) or :func:`convert` (an object
already parsed: YAML, a row). Wrong shapes, wrong types and out-of-range numbers (declare them
``Annotated[int, msgspec.Meta(ge=0, le=...)]``) are refused there, with the path into the
document, so nothing past the boundary checks a shape again::

    class Job(msgspec.Struct):
        id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9]{1,64}$")]
        state: str

    jobs = decode_json(body, list[Job], kind="A-REX job list")  # DocumentError if bad

msgspec was chosen over pydantic v2 and cattrs for its cost: it validates while it parses, in
C, with no intermediate dicts (docs/performance.md has the measured cost of an A-REX status
answer for 1,000 jobs).

A fixed-width table (sdiag's ``%-16s(%8u)`` rows) is read by its producer's own format with
:func:`printf_fields`, never split on blanks: a 16-character user name leaves no blank before
its ``(``. :func:`ascii_int` reads a count written in ASCII digits only (a ``Content-Range``
total; ``int()`` also takes ``"١٢٣"``, ``"1_000"`` and ``" 12 "``).
"""

from __future__ import annotations

import functools
import re
from typing import Any, TypeVar

import msgspec

__all__ = ["DocumentError", "ascii_int", "convert", "decode_json", "printf_fields"]

T = TypeVar("T")

#: A document larger than this is refused before it is parsed (``max_bytes`` to change it).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class DocumentError(ValueError):
    """A document from outside that is not what its kind must be: ``kind`` names the document,
    the message says where in it and what was wrong."""

    def __init__(self, kind: str, problem: str) -> None:
        self.kind, self.problem = kind, problem
        super().__init__(f"{kind}: {problem}")


def decode_json(
    data: bytes | bytearray | memoryview | str,
    type_: type[T] | Any,
    *,
    kind: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> T:
    """The JSON document ``data`` decoded and checked as ``type_`` (a ``msgspec.Struct``, or
    a container of them) in one pass.

    :param data: the document as received.
    :param type_: what it must be.
    :param kind: what the document is, for the error ("A-REX job list").
    :param max_bytes: a longer document is refused unread.
    :raises DocumentError: not JSON, too large, too deep, or not of ``type_``.
    """
    if len(data) > max_bytes:
        raise DocumentError(kind, f"{len(data)} bytes, more than the {max_bytes} allowed")
    try:
        return msgspec.json.decode(data, type=type_, strict=True)
    except (msgspec.DecodeError, RecursionError, UnicodeError, ValueError) as exc:
        raise DocumentError(kind, str(exc)) from None


def convert(obj: Any, type_: type[T] | Any, *, kind: str) -> T:
    """``obj`` (a document already parsed: YAML, a row, a heartbeat's fields) checked and
    turned into ``type_``.

    :param obj: the parsed document.
    :param type_: what it must be.
    :param kind: what the document is, for the error.
    :raises DocumentError: ``obj`` is not of ``type_``.
    """
    try:
        return msgspec.convert(obj, type_, strict=True)
    except (msgspec.ValidationError, RecursionError, TypeError, ValueError) as exc:
        raise DocumentError(kind, str(exc)) from None


@functools.lru_cache(maxsize=64)
def _printf_pattern(fmt: str) -> re.Pattern[str]:
    out: list[str] = []
    at = 0
    for spec in _SPEC.finditer(fmt):
        out.append(re.escape(fmt[at : spec.start()]))
        width = int(spec["width"] or 0)
        if spec["conv"] == "%":
            out.append("%")
        elif spec["conv"] == "s":
            # printf pads a value to its width and never cuts one: at least width characters
            out.append(f"(.{{{width},}}?)" if width else "(.*?)")
        else:  # an integer, padded to its width with blanks (or zeros)
            # padded to its width with blanks or zeros, before (%8u) or after (%-8u) it
            digits = "[ 0]*[+-]?[0-9]+ *"
            out.append(f"((?=[ 0-9+-]{{{width}}}){digits})" if width else "([+-]?[0-9]+)")
        at = spec.end()
    out.append(re.escape(fmt[at:]))
    return re.compile("".join(out))


_SPEC = re.compile(
    r"%(?P<flags>[-0 +#]*)(?P<width>[0-9]*)(?:\.[0-9]+)?(?:l|ll|h|z)?(?P<conv>[sduil%])"
)


def printf_fields(line: str, fmt: str, *, kind: str) -> tuple[str, ...]:
    """The fields of ``line``, a row printed with the C format ``fmt``, each stripped of its
    padding: ``printf_fields("  firstname.lastname(     500) ...", "  %-16s(%8u) %s")``.

    A ``%-16s`` field is read as the producer printed it: padded to 16 characters and never
    cut, so a 16-character value that leaves no blank before the next mark is still its own.

    :param line: one row as the producer printed it.
    :param fmt: the producer's format for the row (``%s``, ``%Ns``, ``%-Ns``, ``%Nu``, ``%Nd``
        and literal text).
    :param kind: what the table is, for the error.
    :raises DocumentError: the row does not have the format's shape.
    """
    match = _printf_pattern(fmt).fullmatch(line)
    if match is None:
        raise DocumentError(kind, f"row {line[:200]!r} is not of the form {fmt!r}")
    return tuple(field.strip() for field in match.groups())


def ascii_int(text: str, *, kind: str, maximum: int) -> int:
    """``text`` as a count: ASCII digits only, at most ``maximum``.

    :param text: the count as written.
    :param kind: what it counts, for the error.
    :param maximum: the largest value accepted (no 400-digit number reaches ``int()``).
    :raises DocumentError: other characters, or more than ``maximum``.
    """
    if not text or len(text) > len(str(maximum)) or not (text.isascii() and text.isdigit()):
        raise DocumentError(kind, f"{text[:40]!r} is not a count in ASCII digits")
    value = int(text)
    if value > maximum:
        raise DocumentError(kind, f"{value} is more than {maximum}")
    return value
