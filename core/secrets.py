"""Secrets named in a config (an environment variable or a file), never written inline.

Kept apart from config.py so that code on a start-up path (the gate's shims) can read a secret
without importing the schema machinery.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["SECRET_SCHEMA", "read_secret", "SecretError"]

#: How a secret is given: the name of an environment variable or a file, never the value.
SECRET_SCHEMA: dict[str, Any] = {
    "description": "A secret read at run time: {env: VARIABLE} or {file: /path/to/file}.",
    "type": "object",
    "properties": {
        "env": {"type": "string", "minLength": 1},
        "file": {"type": "string", "minLength": 1, "x-gridgate-path": True},
    },
    "additionalProperties": False,
    "minProperties": 1,
    "maxProperties": 1,
    "x-gridgate-secret": True,
}


class SecretError(Exception):
    """A secret named in the config could not be read. The message never holds the value."""


def read_secret(spec: Mapping[str, str] | None) -> str | None:
    """Read a secret given as ``{env: NAME}`` or ``{file: PATH}``; None when not configured.

    Trailing newlines of a file are stripped. A file that group or others may access, or
    that belongs to another user than the reader or root, is refused (:func:`file_problem`).

    :param spec: the value of a key whose schema is ``SECRET_SCHEMA``.
    :raises SecretError: when the variable is unset, or the file cannot be read or is refused.
    """
    if not spec:
        return None
    if "env" in spec:
        value = os.environ.get(spec["env"])
        if value is None:
            raise SecretError(f"environment variable {spec['env']} is not set")
        return value
    path = spec["file"]
    try:
        # non-blocking: a FIFO put in the file's place cannot hang open() (it is refused below)
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SecretError(f"cannot read secret file {path}: {exc.strerror}") from None
    try:
        # checked on the open file, not on the name: nothing can be swapped in between
        problem = file_problem(path, os.fstat(fd))
        if problem:
            raise SecretError(problem)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_SECRET_BYTES + 1)
        if len(data) > MAX_SECRET_BYTES:
            raise SecretError(f"secret file {path} is longer than {MAX_SECRET_BYTES} bytes")
    except OSError as exc:
        raise SecretError(f"cannot read secret file {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise SecretError(f"secret file {path} is not UTF-8 text") from None


#: A secret file longer than this is not read (a password or a key is a few bytes).
MAX_SECRET_BYTES = 64 * 1024


def file_problem(path: str, info: os.stat_result) -> str | None:
    """Why a secret file must not be trusted, or None: as ssh does for a private key, a file
    that anybody but its owner may read or write, or that belongs to another user than the
    reader or root (who could then change it), is refused."""
    if not stat.S_ISREG(info.st_mode):
        return f"secret file {path} is not a regular file"
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        return (
            f"secret file {path} has mode {mode:04o}: it must not be accessible by group "
            f"or others (chmod 600 {path})"
        )
    euid = os.geteuid()
    if info.st_uid not in (euid, 0):
        return (
            f"secret file {path} belongs to uid {info.st_uid}, not to this user (uid "
            f"{euid}) or root: its owner could change the secret"
        )
    return None


def secret_problems(
    instance: Any, schema: Mapping[str, Any], path: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """``(path, message)`` for every ``{file: ...}`` secret of a validated document whose
    file exists and is not private (``config validate`` reports them; a missing file is
    reported when the program that needs it reads it)."""
    if not isinstance(schema, Mapping):
        return
    if schema.get("x-gridgate-secret"):
        if isinstance(instance, Mapping) and isinstance(instance.get("file"), str):
            try:
                info = os.stat(instance["file"])
            except OSError:
                return
            problem = file_problem(instance["file"], info)
            if problem:
                yield (*path, "file"), problem
        return
    for branch in (*schema.get("oneOf", ()), *schema.get("anyOf", ()), *schema.get("allOf", ())):
        yield from secret_problems(instance, branch, path)
    if isinstance(instance, Mapping):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, value in instance.items():
            sub = props.get(key, extra if isinstance(extra, Mapping) else None)
            if sub is not None:
                yield from secret_problems(value, sub, (*path, key))
    elif isinstance(instance, list) and isinstance(schema.get("items"), Mapping):
        for index, value in enumerate(instance):
            yield from secret_problems(value, schema["items"], (*path, index))
