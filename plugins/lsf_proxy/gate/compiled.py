"""Compiled shims: ``shim.c`` built per command, its settings written into it as C literals.

A Python shim, however lean, starts an interpreter at every gated call: about 7 ms here,
which is most of what a light user's one squeue a second pays for the gate (docs/gate.md,
docs/performance.md). ``shim.c`` is shim.py's common path without the interpreter: a granted
call costs what exec'ing the real command costs. Anything rarer (a config changed since
install, a ride on a gated command's token, a refusal to word, a reply it cannot read) execs
the Python shim written beside it, :func:`fallback_name`.

The settings are the Python shim's (``gate.shim_settings``), written as a header of C
literals: every byte of a string outside a small safe set is an octal escape, so text from the
config (a socket path, a daemon's name) is never read as C. The compiler is ``$CC``, else ``cc``
or ``gcc`` found on the installer's PATH, run as an argv list with a deadline, in a private
temporary folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "COMPILE_TIMEOUT",
    "FALLBACK_PREFIX",
    "MARK",
    "CompileError",
    "build",
    "compiler",
    "daemons_at_install",
    "fallback_name",
    "header",
    "source",
]

#: The Python shim a compiled one execs for what it leaves to the whole gate:
#: ``DIR/.gridgate-python-NAME``.
FALLBACK_PREFIX = ".gridgate-python-"
#: Written into every compiled shim (``strings`` finds it; install recognises its own).
MARK = b"gridgate gate shim (compiled)"
#: Seconds a compiler may take for one shim.
COMPILE_TIMEOUT = 120.0

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 /._-:,={}")


class CompileError(Exception):
    """No compiler, or it refused the shim (its message says why)."""


def fallback_name(name: str) -> str:
    """The Python shim beside the compiled shim ``name``."""
    return FALLBACK_PREFIX + name


def compiler() -> str | None:
    """The C compiler: ``$CC`` (one program, by name or path), else ``cc`` or ``gcc`` on
    PATH; None when there is none."""
    named = os.environ.get("CC", "").strip()
    if named:
        return shutil.which(named)
    return shutil.which("cc") or shutil.which("gcc")


def _c_string(text: str) -> str:
    """``text`` as a C string literal: safe bytes as they are, every other an octal escape
    (three digits, so a digit after it is never read as part of it)."""
    data = text.encode("utf-8", "surrogateescape")
    if b"\0" in data:
        raise ValueError(f"a NUL byte in a setting: {text!r}")
    return '"' + "".join(chr(b) if b in _SAFE else f"\\{b:03o}" for b in data) + '"'


def _c_strings(texts: list[str]) -> str:
    return "{" + ", ".join([*(_c_string(t) for t in texts), "0"]) + "}"


def daemons_at_install(conf: dict[str, Any]) -> list[tuple[str, str]] | None:
    """(name, Unix socket) of each daemon the shim asks, as shim.py's ``_daemons`` orders them
    without ``$GRIDGATE_PROXYD_SOCKET`` (a compiled shim hands a call with it set to the Python
    shim); ``[]``: the runtime directory's socket, found at run time; None when the compiled
    shim cannot ask them (a daemon over TCP signs its requests, a relative path is the caller's
    working directory's): then only the Python shim is written."""
    given, hosts = conf["socket"], conf["hosts"]
    if given or not hosts:
        path = given or conf["default_socket"]
        if not path:
            return []
        if not path.startswith("/"):
            return None
        return [(os.uname().nodename.split(".")[0], path)]
    if any(not address.startswith("/") for _, address in hosts):
        return None
    return [(name, address) for name, address in hosts]


def header(conf: dict[str, Any], fallback: str) -> str | None:
    """The settings of the compiled shim for ``conf`` (``gate.shim_settings``) as C, or None
    when only a Python shim can serve it (:func:`daemons_at_install`)."""
    daemons = daemons_at_install(conf)
    if daemons is None:
        return None
    sig = (conf["snap"] or {}).get("sig") if conf["config"] else None
    if conf["config"] and not sig:
        return None  # the config is not there: the Python shim says so
    words = sorted(conf["words"].items())
    flags = conf["start_only"]
    lines = [
        "/* Written by gridgate gate --install-shims: the settings of one compiled shim. */",
        f"#define GG_NAME {_c_string(conf['name'])}",
        f"#define GG_REAL {_c_string(conf['real'] or '')}",
        f"#define GG_FALLBACK {_c_string(fallback)}",
        f"#define GG_CONFIG {_c_string(conf['config'] or '')}",
        "static const long long GG_CONFIG_SIG[5] = {"
        + ", ".join(f"{int(v)}LL" for v in (sig or [0, 0, 0, 0, 0]))
        + "};",
        f"#define GG_NDAEMONS {len(daemons)}",
        f"static const char *const GG_DAEMON_NAMES[] = {_c_strings([n for n, _ in daemons])};",
        f"static const char *const GG_DAEMON_PATHS[] = {_c_strings([p for _, p in daemons])};",
        f"#define GG_DAEMON_LIST {_c_string(', '.join(n for n, _ in daemons))}",
        f"#define GG_CATEGORY {_c_string(conf['category'])}",
        f"#define GG_REQUEST {_c_string(conf['request'][conf['category']])}",
        f"#define GG_NWORDS {len(words)}",
        f"static const char *const GG_WORDS[] = {_c_strings([w for w, _ in words])};",
        "static const char *const GG_WORD_CATEGORIES[] = "
        + _c_strings([c for _, c in words])
        + ";",
        "static const char *const GG_WORD_REQUESTS[] = "
        + _c_strings([conf["request"][c] for _, c in words])
        + ";",
        f"#define GG_NSTART {-1 if flags is None else len(flags)}",
        f"static const char *const GG_START_FLAGS[] = {_c_strings(list(flags or []))};",
        f"#define GG_START_HOLD {float(conf['start_hold'])!r}",
        f"#define GG_CONNECT_TIMEOUT {float(conf['connect_timeout'])!r}",
        f"#define GG_REPLY_TIMEOUT {float(conf['reply_timeout'])!r}",
        "#define GG_NOTOKEN_NTRIES "
        + str(-1 if conf["notoken_ntries"] is None else int(conf["notoken_ntries"])),
        f"#define GG_WHEN_UNAVAILABLE {_c_string(conf['when_unavailable'])}",
        f"#define GG_SUBMITS {int(bool(conf['submits']))}",
        f"#define GG_NICE_CALLER {int(bool(conf['nice_caller']))}",
    ]
    return "\n".join(lines) + "\n"


def source() -> bytes:
    """The text of ``shim.c``, as installed with the package."""
    return resources.files("gridgate.plugins.lsf_proxy.gate").joinpath("shim.c").read_bytes()


def build(settings: str, cc: str | None = None, code: bytes | None = None) -> bytes:
    """``shim.c`` (``code``: its text, :func:`source` when not given) compiled with
    ``settings`` (a :func:`header`): the executable's bytes.

    :raises CompileError: no compiler, or it failed (its output in the message).
    """
    cc = cc or compiler()
    path = os.environ.get("PATH", "/usr/bin:/bin")
    if cc is None:
        raise CompileError("no C compiler (cc or gcc) on PATH")
    code = source() if code is None else code
    with tempfile.TemporaryDirectory(prefix="gridgate-shim-") as tmp:
        folder = Path(tmp)
        (folder / "shim.c").write_bytes(code)
        (folder / "gg_settings.h").write_text(settings, encoding="utf-8")
        argv = [cc, "-O2", "-std=gnu11", "-Wall", "-Wextra", "-s", "-o", "shim", "shim.c"]
        try:
            done = subprocess.run(
                argv,
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=COMPILE_TIMEOUT,
                # the compiler's own folder first: where its assembler and linker are
                env={"PATH": os.pathsep.join([os.path.dirname(cc), path]), "LC_ALL": "C"},
            )
        except subprocess.TimeoutExpired:
            raise CompileError(f"{cc} took more than {COMPILE_TIMEOUT:.0f} s") from None
        except OSError as exc:
            raise CompileError(f"cannot run {cc}: {exc}") from None
        if done.returncode != 0:
            raise CompileError(f"{cc} failed: {(done.stderr or done.stdout).strip()[-2000:]}")
        return (folder / "shim").read_bytes()
