"""The boundary for outside documents (gridgate.core.documents): one error type for every way a
document is wrong, fixed-width rows read by their producer's format."""

from __future__ import annotations

from typing import Annotated

import msgspec
import pytest

from gridgate.core.documents import DocumentError, ascii_int, convert, decode_json, printf_fields


class Claims(msgspec.Struct):
    sub: str
    exp: Annotated[int, msgspec.Meta(ge=0, le=2**40)]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"sub": "a", "exp": ' + b"9" * 400 + b"}", "$.exp"),
        (b'{"sub": 1, "exp": 2}', "$.sub"),
        (b'{"sub": "a", "exp": 1.5}', "$.exp"),
        (b'{"sub": "a", "exp": true}', "$.exp"),
        (b'{"sub": "a"}', "exp"),
        (b"[" * 200_000, "object"),
        (b"\xff\xfe", "JSON"),
        (b'{"sub": "a", "exp": "5"}', "$.exp"),
    ],
)
def test_every_bad_document_is_one_value_error_naming_where(body: bytes, where: str) -> None:
    with pytest.raises(DocumentError, match="token claims") as caught:
        decode_json(body, Claims, kind="token claims")
    assert isinstance(caught.value, ValueError)
    assert where.lower() in str(caught.value).lower()


def test_a_good_document_is_typed() -> None:
    assert decode_json('{"sub": "a", "exp": 7, "other": 1}', Claims, kind="c") == Claims("a", 7)
    assert convert({"sub": "a", "exp": 7}, Claims, kind="c") == Claims("a", 7)
    with pytest.raises(DocumentError, match=r"c: Expected `int`, got `str` - at `\$.exp`"):
        convert({"sub": "a", "exp": "7"}, Claims, kind="c")


def test_a_document_over_its_size_is_refused_unread() -> None:
    with pytest.raises(DocumentError, match="more than the 10 allowed"):
        decode_json(b'{"sub": "abcdefgh"}', Claims, kind="c", max_bytes=10)


ROW = "  %-16s(%8u) count:%-6u ave_time:%-6u total_time:%u"


@pytest.mark.parametrize(
    ("user", "uid"),
    [("bob", "1234"), ("firstname.lastn", "500"), ("firstname.lastname", "500"), ("x" * 40, "7")],
)
def test_a_fixed_width_row_is_read_by_its_format_whatever_the_value_length(
    user: str, uid: str
) -> None:
    # printed as sdiag prints it: C printf widths, which Python's % applies the same way
    row = "  %-16s(%8s) count:%-6s ave_time:%-6s total_time:%s"
    line = row % (user, uid, "500", "12", "6000")  # noqa: UP031
    assert printf_fields(line, ROW, kind="sdiag") == (user, uid, "500", "12", "6000")


def test_a_row_of_another_shape_is_refused() -> None:
    with pytest.raises(DocumentError, match="is not of the form"):
        printf_fields("  bob (12) count:1", ROW, kind="sdiag")


@pytest.mark.parametrize("text", ["١٢٣", "1_000", " 12", "12 ", "-1", "", "9" * 400, "+5"])
def test_a_count_is_ascii_digits_only(text: str) -> None:
    with pytest.raises(DocumentError):
        ascii_int(text, kind="Content-Range total", maximum=10**12)


def test_a_count_over_its_maximum_is_refused() -> None:
    assert ascii_int("1000", kind="n", maximum=1000) == 1000
    with pytest.raises(DocumentError, match="1001 is more than 1000"):
        ascii_int("1001", kind="n", maximum=1000)
