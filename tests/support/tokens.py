"""Bearer tokens for tests: a JWT in compact form with chosen claims, whose signature nobody
checks here (the bearer-token credential reads ``exp`` and ``nbf``; a real CE checks the
signature, and its tests get their tokens from the private issuer)."""

from __future__ import annotations

import base64
import json
import os
import uuid
from typing import Any


def b64url(obj: Any) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def jwt(**claims: Any) -> str:
    """A JWT in compact form with these claims (a signature nobody checks here: the CE does)."""
    header = {"alg": "RS256", "typ": "JWT", "kid": "k1"}
    payload = {"iss": "https://issuer.example", "sub": "pilots", "jti": str(uuid.uuid4())}
    payload.update(claims)
    return f"{b64url(header)}.{b64url(payload)}.{b64url(os.urandom(32))}"
