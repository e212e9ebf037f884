"""An example third-party gridgate backend (``local``), packaged on its own."""

from __future__ import annotations

from gridgate_example_backend.backend import LocalBackend

__all__ = ["LocalBackend"]
__version__ = "0.1.0"
