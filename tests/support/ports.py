"""Loopback ports for tests that start real servers: the testing kit's (one definition)."""

from __future__ import annotations

from gridgate.core.testing import free_port

__all__ = ["free_port"]
