"""Secrets named in a config (an environment variable or a file), never written inline.

Kept apart from config.py so that code on a start-up path (the gate's shims) can read a secret
without importing the schema machinery.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: How a secret is given: the name of an environment variable or a file, never the value.
SECRET_SCHEMA: dict[str, Any] = {
    "description": "A secret read at run time: {env: VARIABLE} or {file: /path/to/file}.",
    "type": "object",
    "properties": {"env": {"type": "string", "minLength": 1}, "file": {"type": "string", "minLength": 1}},
    "additionalProperties": False,
    "minProperties": 1,
    "maxProperties": 1,
    "x-gridgate-secret": True,
}


class SecretError(Exception):
    """A secret named in the config could not be read. The message never holds the value."""


def read_secret(spec: Mapping[str, str] | None) -> str | None:
    """Read a secret given as ``{env: NAME}`` or ``{file: PATH}``; None when not configured.

    Trailing newlines of a file are stripped.

    :param spec: the value of a key whose schema is ``SECRET_SCHEMA``.
    :raises SecretError: when the variable is unset or the file cannot be read.
    """
    if not spec:
        return None
    if "env" in spec:
        value = os.environ.get(spec["env"])
        if value is None:
            raise SecretError(f"environment variable {spec['env']} is not set")
        return value
    try:
        return Path(spec["file"]).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise SecretError(f"cannot read secret file {spec['file']}: {exc.strerror}") from None
