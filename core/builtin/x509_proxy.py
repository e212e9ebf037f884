"""The built-in ``x509_proxy`` credential: an X.509 proxy (RFC 3820) in a PEM file, its
lifetime read with ``cryptography``, renewed by a command such as ``arcproxy`` or
``voms-proxy-init``, handed to the backends that need kind ``x509`` as ``X509_USER_PROXY``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from gridgate.core.credentials import CredentialError, CredentialPlugin, Validity, credential_schema


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class X509Proxy(CredentialPlugin):
    """An X.509 proxy (RFC 3820) in a PEM file: its lifetime is read with ``cryptography``
    (the first certificate is the proxy; no certificate in the file may have ended), renewed by
    a command such as ``arcproxy`` or ``voms-proxy-init``, handed out as ``X509_USER_PROXY``."""

    name = "x509_proxy"
    kind = "x509"
    env_var = "X509_USER_PROXY"
    what = "X.509 proxy"
    config_schema: ClassVar[dict[str, Any]] = credential_schema(
        "An X.509 proxy the director checks before each iteration (its lifetime read from the "
        "file), renews with renew when it runs short, and hands to the backends that need kind "
        "x509 as X509_USER_PROXY. While it is missing or expired those backends submit nothing."
    )

    def validity(self, data: bytes) -> Validity:
        from cryptography import x509  # imported here: only a director with a proxy pays for it

        if b"-----BEGIN CERTIFICATE-----" not in data:
            raise CredentialError("holds no PEM certificate")
        try:
            certificates = x509.load_pem_x509_certificates(data)
        except ValueError as exc:
            reason = str(exc).rsplit("details. ", 1)[-1]
            raise CredentialError(
                f"holds a PEM certificate that cannot be read ({reason})"
            ) from None
        proxy = certificates[0]
        proxy_end = proxy.not_valid_after_utc.timestamp()
        # a proxy cannot outlive the certificates that signed it, when the file carries them
        ends = min(certificates, key=lambda c: c.not_valid_after_utc)
        not_after = ends.not_valid_after_utc.timestamp()
        detail = ""
        if not_after < proxy_end:
            detail = (
                f"the proxy itself ends {_iso(proxy_end)}, but its issuer "
                f"{ends.subject.rfc4514_string()} ends first"
            )
        not_before = max(c.not_valid_before_utc for c in certificates).timestamp()
        return Validity(not_before=not_before, not_after=not_after, detail=detail)
