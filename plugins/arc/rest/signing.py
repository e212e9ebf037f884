"""A delegation's certificate: the CE's request signed with the client's proxy (RFC 3820).

To delegate, A-REX makes a key pair and sends a certificate request; the client answers with a
proxy certificate for that key, issued by its own proxy, and the chain behind it. Two things
about A-REX 6.17's request (``shared/reference/arc.md``, REST interface, trap 1): its version
field is 2 (``Version: Unknown (2)``), which current ``cryptography`` refuses to load
(``2 is not a valid CSR version``), and its subject is empty. So :func:`load_arc_csr` loads a
copy whose version byte is 0 and checks the CE's signature over the **original** bytes with the
request's own key; and :func:`sign_request` builds the new proxy's subject from the client's
proxy (its subject plus ``CN=<serial>``), never from the request: only its public key is used.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID, ObjectIdentifier

__all__ = [
    "PROXY_CERT_INFO",
    "CsrError",
    "Proxy",
    "ProxyError",
    "identity_key",
    "load_arc_csr",
    "read_proxy",
    "sign_request",
]

#: id-pe-proxyCertInfo (RFC 3820 section 3.8)
PROXY_CERT_INFO = ObjectIdentifier("1.3.6.1.5.5.7.1.14")
#: ProxyCertInfo with no path length limit and the id-ppl-inheritAll policy
#: (1.3.6.1.5.5.7.21.1): SEQUENCE { SEQUENCE { OID } }
INHERIT_ALL = bytes.fromhex("300c300a06082b06010505071501")
#: How far back a delegated certificate's start is put: clocks of CE and client differ.
CLOCK_SKEW = timedelta(minutes=5)
_KEY_RE = re.compile(
    rb"-----BEGIN (?P<kind>(?:RSA |EC |ENCRYPTED )?PRIVATE KEY)-----.*?-----END (?P=kind)-----",
    re.DOTALL,
)


class CsrError(ValueError):
    """The CE's certificate request cannot be read, or its signature is not the CE's."""


class ProxyError(ValueError):
    """The proxy file holds no certificate with its key."""


@dataclass(frozen=True)
class Proxy:
    """A proxy file read: its certificates (the proxy first, then its chain), its key, and what
    identifies it.

    ``identity`` is the subject of the end-entity certificate behind it (the user's, the first
    certificate without ProxyCertInfo), the same across renewals; ``fingerprint`` the SHA-256
    of the proxy certificate, new at every renewal; ``not_after`` when the proxy ends (a proxy
    cannot outlive its chain, so the earliest end of the file's certificates).
    """

    certificates: tuple[x509.Certificate, ...]
    key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    identity: str
    fingerprint: str
    not_after: float
    #: when the proxy starts (its first certificate's ``notBefore``): of two proxies of one
    #: credential, the one made later is the one in force
    not_before: float = 0.0
    #: SHA-256 of what the proxy carries beyond its DN (VOMS attribute certificates, a policy
    #: other than inherit-all: a limited or restricted proxy); "" for a plain proxy
    attributes: str = ""

    @property
    def credential(self) -> str:
        """What a delegation is made for: the DN, and its attributes when there are any (two
        proxies of one DN with other VOMS roles or restrictions get a delegation each: one
        never stands in for the other)."""
        return f"{self.identity}\n{self.attributes}" if self.attributes else self.identity

    def newer(self, fingerprint: str, not_before: float, not_after: float) -> bool:
        """Whether this proxy replaces a delegation signed with the proxy of ``fingerprint``
        (starting ``not_before``, ending ``not_after``): another proxy, made later, or made at
        the same time and ending later. A replaced proxy whose new key ends sooner is in force
        at once (the old one may have leaked); an older proxy never replaces a newer one."""
        if fingerprint == self.fingerprint:
            return False
        if abs(self.not_before - not_before) <= 1:
            return self.not_after > not_after + 1
        return self.not_before > not_before

    @property
    def certificate(self) -> x509.Certificate:
        return self.certificates[0]


def read_proxy(data: bytes) -> Proxy:
    """The proxy in ``data`` (a PEM file: certificate, key, chain).

    :raises ProxyError: when there is no certificate, no unencrypted key, or the key is not
        the first certificate's."""
    try:
        certificates = tuple(x509.load_pem_x509_certificates(data))
    except ValueError:
        raise ProxyError("holds no PEM certificate") from None
    found = _KEY_RE.search(data)
    if found is None:
        raise ProxyError("holds no private key")
    try:
        key = serialization.load_pem_private_key(found.group(0), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ProxyError(f"its private key cannot be read: {exc}") from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ProxyError(f"its key is {type(key).__name__}, not RSA or EC")
    public = (
        certificates[0]
        .public_key()
        .public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    mine = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if public != mine:
        raise ProxyError("its key does not belong to its first certificate")
    end_entity = next(
        (c for c in certificates if not _is_proxy(c)),
        certificates[-1],
    )
    return Proxy(
        certificates=certificates,
        key=key,
        identity=end_entity.subject.rfc4514_string(),
        fingerprint=certificates[0].fingerprint(hashes.SHA256()).hex(),
        not_after=min(c.not_valid_after_utc for c in certificates).timestamp(),
        not_before=certificates[0].not_valid_before_utc.timestamp(),
        attributes=_attributes(certificates),
    )


#: The VOMS attribute certificates' extension (their FQANs: VO, group, role).
VOMS_AC = ObjectIdentifier("1.3.6.1.4.1.8005.100.100.5")
#: ``id-ppl-inheritAll`` (1.3.6.1.5.5.7.21.1), DER: a proxy with every right of its issuer.
INHERIT_ALL_OID = bytes.fromhex("06082b06010505071501")


def _attributes(certificates: tuple[x509.Certificate, ...]) -> str:
    """SHA-256 of what the proxies of ``certificates`` carry beyond their DN: every VOMS
    extension, every ProxyCertInfo whose policy is not inherit-all; "" when none does."""
    found = []
    for certificate in certificates:
        for extension in certificate.extensions:
            value = extension.value
            raw = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
            if extension.oid == VOMS_AC or (
                extension.oid == PROXY_CERT_INFO and INHERIT_ALL_OID not in raw
            ):
                found.append(extension.oid.dotted_string.encode() + b"=" + raw)
    return hashlib.sha256(b"\n".join(found)).hexdigest() if found else ""


def _is_proxy(certificate: x509.Certificate) -> bool:
    try:
        certificate.extensions.get_extension_for_oid(PROXY_CERT_INFO)
    except x509.ExtensionNotFound:
        return False
    return True


# --- the CE's request ----------------------------------------------------------------------------


def _der_header(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of the content, end of the content) of the DER element at ``at``."""
    if at + 2 > len(data):
        raise CsrError("truncated DER")
    tag, first = data[at], data[at + 1]
    if first < 0x80:
        start, length = at + 2, first
    else:
        size = first & 0x7F
        if size == 0 or size > 4 or at + 2 + size > len(data):
            raise CsrError("bad DER length")
        start, length = at + 2 + size, int.from_bytes(data[at + 2 : at + 2 + size], "big")
    if start + length > len(data):
        raise CsrError("truncated DER")
    return tag, start, start + length


def load_arc_csr(pem: bytes) -> x509.CertificateSigningRequest:
    """The CE's certificate request, loaded although its version is 2, its signature checked.

    The version INTEGER inside CertificationRequestInfo is set to 0 in a copy, which
    ``cryptography`` loads; the CE's signature is then verified over the original
    CertificationRequestInfo with the request's own public key, so a request altered on the
    way (or a patched byte in the wrong place) fails here.

    :raises CsrError: when it is no PEM request, cannot be parsed, or its signature is wrong.
    """
    text = pem.decode("ascii", "replace")
    found = re.search(
        r"-----BEGIN (NEW )?CERTIFICATE REQUEST-----(.*?)-----END (NEW )?CERTIFICATE REQUEST-----",
        text,
        re.DOTALL,
    )
    if found is None:
        raise CsrError("the CE's answer holds no PEM certificate request")
    try:
        der = base64.b64decode("".join(found.group(2).split()), validate=True)
    except ValueError:
        raise CsrError("the certificate request is not valid base64") from None
    tag, outer, _end = _der_header(der, 0)
    if tag != 0x30:
        raise CsrError("the certificate request is not a DER SEQUENCE")
    tag, info_start, _info_end = _der_header(der, outer)
    if tag != 0x30:
        raise CsrError("no CertificationRequestInfo in the request")
    info_at = outer
    tag, version_start, version_end = _der_header(der, info_start)
    if tag != 0x02 or version_end - version_start != 1:
        raise CsrError("no one-byte version in the request")
    patched = bytearray(der)
    patched[version_start] = 0
    try:
        csr = x509.load_der_x509_csr(bytes(patched))
    except ValueError as exc:
        raise CsrError(f"the certificate request cannot be parsed: {exc}") from None
    tbs = der[info_at:_info_end]
    algorithm = csr.signature_hash_algorithm
    key = csr.public_key()
    try:
        if isinstance(key, rsa.RSAPublicKey) and algorithm is not None:
            key.verify(csr.signature, tbs, padding.PKCS1v15(), algorithm)
        elif isinstance(key, ec.EllipticCurvePublicKey) and algorithm is not None:
            key.verify(csr.signature, tbs, ec.ECDSA(algorithm))
        else:
            raise CsrError(f"unsupported request key {type(key).__name__}")
    except InvalidSignature:
        raise CsrError("the certificate request's signature is not valid") from None
    return csr


def sign_request(
    csr: x509.CertificateSigningRequest, proxy: Proxy, now: datetime | None = None
) -> bytes:
    """The PEM to PUT back: a new RFC 3820 proxy for the request's key, issued by ``proxy``,
    followed by ``proxy``'s own certificates (the chain A-REX verifies).

    The subject is the proxy's subject plus ``CN=<serial>`` (the request's empty subject is not
    used), the issuer the proxy's subject; ProxyCertInfo critical (inherit all), KeyUsage
    critical (digitalSignature, keyEncipherment); it starts :data:`CLOCK_SKEW` before ``now``
    and ends with the proxy; SHA-256, signed with the proxy's key.
    """
    now = now or datetime.now(UTC)
    issuer = proxy.certificate
    serial = secrets.randbits(63) | 1 << 62  # positive, never 0, fits the int64 of old parsers
    subject = x509.Name(
        [
            *issuer.subject.rdns,
            x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COMMON_NAME, str(serial))]),
        ]
    )
    not_after = min(c.not_valid_after_utc for c in proxy.certificates)
    not_before = max(now - CLOCK_SKEW, issuer.not_valid_before_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject)
        .public_key(csr.public_key())
        .serial_number(serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.UnrecognizedExtension(PROXY_CERT_INFO, INHERIT_ALL), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    delegated = builder.sign(proxy.key, hashes.SHA256())
    return b"".join(
        c.public_bytes(serialization.Encoding.PEM) for c in (delegated, *proxy.certificates)
    )


def identity_key(service: str, identity: str) -> str:
    """A short stable key for one CE and one credential identity (state-store keys)."""
    return hashlib.sha256(f"{service}\n{identity}".encode()).hexdigest()[:24]
