"""Tokens fetched from an issuer, shared through the state store by every director (and every
credential of one director) that asks the same issuer for the same client, scope and audience:
one token request per lapse, not one per director.

The store holds the token sealed (AES-GCM) under a key derived (HKDF-SHA256) from the client's
secret: a reader of the store who does not hold the secret (a Redis another service shares, a
PostgreSQL backup) gets nothing usable, while every director that can ask the issuer itself can
open it. The entry expires with the token. A director that finds no token with its
``min_lifetime`` left takes a short lock, fetches, and publishes; the others wait for its token
until the lock goes, then fetch on their own if it gave none. A token that cannot be opened (the
secret was rotated, the entry is damaged) is fetched again and replaced.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from loguru import logger

from gridgate.core.builtin.documents import SharedTokenEntry, shared_token_entry
from gridgate.core.documents import DocumentError
from gridgate.core.state import StateError, StateStore

__all__ = ["SharedToken", "TokenShare", "share_key"]

#: Where the sealed tokens are kept in the store; the fetch locks beside them.
PREFIX = "credential-token/"
#: How often a director waiting for another's fetch looks for its token.
POLL_SECONDS = 0.2
#: Format of the stored entry.
VERSION = 1


def share_key(url: str, client_id: str, scope: str | None, audience: str | None) -> str:
    """The store key of the token one issuer gives one client for one scope and audience: a hash,
    so the key names no client."""
    what = "\0".join((url.rstrip("/"), client_id, scope or "", audience or ""))
    return PREFIX + hashlib.sha256(what.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class SharedToken:
    """A token found in the store: the token, when it ends (epoch seconds), and who fetched it
    (``host:pid``)."""

    token: str
    expires: float
    fetched_by: str


class TokenShare:
    """The sealed token of one issuer request in the store.

    :param store: the state store the directors share.
    :param key: :func:`share_key` of the request.
    :param secret: the client's secret (the sealing key is derived from it, never stored).
    :param now: the clock that tokens' ends are compared with.
    """

    def __init__(self, store: StateStore, key: str, secret: str, now: Callable[[], float]) -> None:
        self.store = store
        self.key = key
        self.lock_key = key + "/fetching"
        self.now = now
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._aead = AESGCM(
            HKDF(
                algorithm=hashes.SHA256(),
                length=32,
                salt=b"gridgate token share",
                info=key.encode(),
            ).derive(secret.encode())
        )

    def find(self, min_lifetime: float) -> SharedToken | None:
        """The stored token when it has at least ``min_lifetime`` seconds left and opens with
        this secret; None otherwise (nothing there, too short, sealed with another secret, or
        the store cannot be read: the caller fetches its own)."""
        try:
            raw = self.store.get(self.key)
        except StateError as exc:
            logger.warning("the shared token cannot be read from the state store: {}", exc)
            return None
        if raw is None:
            return None
        found = self._open(raw)
        if found is None or found.expires - self.now() < min_lifetime:
            return None
        return found

    def publish(self, token: str, expires: float) -> None:
        """Store ``token`` sealed, to expire with it; a store that refuses is only logged (each
        director then fetches its own)."""
        left = expires - self.now()
        if left <= 0:
            return
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, token.encode(), self.key.encode())
        entry = SharedTokenEntry(
            v=VERSION, expires=expires, by=self.owner, nonce=nonce, sealed=sealed
        )
        try:
            self.store.set(self.key, msgspec.json.encode(entry).decode("ascii"), ttl=left)
        except StateError as exc:
            logger.warning("the fetched token cannot be shared through the state store: {}", exc)

    def claim(self, seconds: float) -> bool:
        """Take the fetch lock for ``seconds``; False when another director holds it (or the
        store cannot lock: then everyone fetches for themselves)."""
        try:
            return self.store.add_if_absent(self.lock_key, self.owner, ttl=max(seconds, 1.0))
        except StateError:
            return True

    def release(self) -> None:
        """Hand the fetch lock back."""
        try:
            self.store.delete_if(self.lock_key, self.owner)
        except StateError:
            pass

    def wait(self, min_lifetime: float, deadline: float) -> SharedToken | None:
        """Wait (until ``deadline``, on the monotonic clock) for the director holding the lock
        to publish a token; None when its lock goes without one, or at the deadline."""
        while time.monotonic() < deadline:
            found = self.find(min_lifetime)
            if found is not None:
                return found
            try:
                if self.store.get(self.lock_key) is None:
                    return self.find(min_lifetime)
            except StateError:
                return None
            time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))
        return None

    def _open(self, raw: str) -> SharedToken | None:
        try:
            entry = shared_token_entry(raw)
        except DocumentError as exc:
            logger.warning("the shared token in the state store is damaged: {}", exc.problem)
            return None
        if entry.v != VERSION:
            return None
        try:
            token = self._aead.decrypt(entry.nonce, entry.sealed, self.key.encode()).decode()
        except (InvalidTag, ValueError, UnicodeDecodeError):
            # sealed with another secret (rotated), or damaged: fetched again and replaced
            return None
        return SharedToken(token=token, expires=entry.expires, fetched_by=entry.by)
