"""The boundary of the built-in plugins' outside documents: each kind is decoded here, by one
function, into typed values, and every way it can be wrong is one
:class:`~gridgate.core.documents.DocumentError` whose ``problem`` says it in a few words.
Past these functions nothing checks a shape again."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from gridgate.core.documents import DocumentError, decode_json

#: What a JWT is, for its DocumentError.
JWT_KIND = "JWT"
#: The NumericDates a token may carry: those a date can be written for (years 1 to 9999).
EARLIEST_DATE = -62135596800.0
LATEST_DATE = 253402300799.0


@dataclass(frozen=True)
class JwtTimes:
    """When a token is valid, from its claims (unverified): ``exp`` (None: the token has
    none) and ``nbf`` (None: valid from the start), epoch seconds within
    :data:`EARLIEST_DATE` .. :data:`LATEST_DATE`."""

    exp: float | None
    nbf: float | None


def _part(part: bytes) -> Any:
    try:
        raw = base64.urlsafe_b64decode(part + b"=" * (-len(part) % 4))
        return decode_json(raw, Any, kind=JWT_KIND)
    except DocumentError as exc:
        if "out of range" in exc.problem:  # JSON, with a number no float holds (1e400)
            raise DocumentError(
                JWT_KIND, f"holds a JWT with a number out of range ({exc.problem})"
            ) from None
    except (binascii.Error, ValueError):
        pass
    raise DocumentError(
        JWT_KIND, "holds a JWT whose header or payload is not base64url-encoded JSON"
    )


def _date(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DocumentError(
            JWT_KIND, f"holds a JWT whose {name} claim is not a number: {value!r:.40}"
        )
    # compared before any float(): a 400-digit integer overflows one
    if not EARLIEST_DATE <= value <= LATEST_DATE:
        raise DocumentError(
            JWT_KIND, f"holds a JWT whose {name} claim is not a date (out of range): {value!r:.40}"
        )
    return float(value)


def jwt_times(token: bytes) -> JwtTimes:
    """The ``exp`` and ``nbf`` claims of a JWT in compact form (``header.payload.signature``,
    each base64url JSON), unverified: the signature is the services' to check.

    :raises DocumentError: not three parts, a header or payload that is not a base64url JSON
        object, or an ``exp``/``nbf`` that is not a number of seconds a date can have.
    """
    parts = token.strip().split(b".")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise DocumentError(
            JWT_KIND,
            "holds no JWT (a token is three base64url parts joined by dots: header.payload."
            f"signature; this has {len(parts)} part{'s' if len(parts) != 1 else ''})",
        )
    header, payload = _part(parts[0]), _part(parts[1])
    if not isinstance(header, dict) or not isinstance(payload, dict):
        raise DocumentError(JWT_KIND, "holds a JWT whose header or payload is not a JSON object")
    return JwtTimes(exp=_date(payload, "exp"), nbf=_date(payload, "nbf"))
