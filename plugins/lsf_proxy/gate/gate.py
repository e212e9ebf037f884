"""``gridgate gate -- COMMAND ARGS...``: run any batch command under a token from lsfproxyd, and
``--install-shims DIR``: wrapper executables that put ``bjobs``, ``squeue``... behind the gate.

What runs at each gated call (token, child, signals, exit status) is in
:mod:`gridgate.plugins.lsf_proxy.gate.gating`; what a shim runs, in :mod:`.shim`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

import gridgate.core
import gridgate.plugins
from gridgate.core import hookimpl
from gridgate.core.files import atomic_write
from gridgate.plugins.lsf_proxy.client.gateclient import absolute_socket
from gridgate.plugins.lsf_proxy.commands import (
    BY_FIRST_WORD,
    CATEGORIES,
    SHIM_COMMANDS,
    SUBMITTING,
)
from gridgate.plugins.lsf_proxy.gate import compiled
from gridgate.plugins.lsf_proxy.gate import shim as lean
from gridgate.plugins.lsf_proxy.gate.gating import (
    EXIT_CANNOT_EXECUTE,
    EXIT_NO_TOKEN,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    START_ONLY,
    TOKEN_ENV,
    exit_like,
    find_real,
    gate_call,
    gate_category_map,
    infer_category,
    run_gated,
    say,
    shim_main,
    snapshot,
)
from gridgate.plugins.lsf_proxy.wire import PROTOCOL_VERSION

__all__ = [
    "CODE_PREFIX",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_NOT_FOUND",
    "EXIT_NO_TOKEN",
    "EXIT_UNAVAILABLE",
    "SHIM_COMMANDS",
    "SHIM_KINDS",
    "START_ONLY",
    "TOKEN_ENV",
    "Commands",
    "code_name",
    "exit_like",
    "find_real",
    "gate_category_map",
    "gate_command",
    "infer_category",
    "install_shims",
    "run_gated",
    "shim_code",
    "shim_main",
]

#: -I -S: no site-packages, no PYTHON* variables. The rest of a shim is its settings as a
#: literal and a call of :mod:`.shim`'s ``main``, whose code (built-in modules only) is compiled at
#: install time for the interpreter of the first line and kept beside the shims, in a file named
#: by its digest (``CODE_PREFIX``), shared by every shim of the folder: a gated call starts like
#: a bare interpreter. Compiling shim.py's source at every call cost a third of a bare
#: interpreter's start; reading the code from the shim's own text as base64 cost 0.45 ms more
#: than from its file (the tokenizer reads 46 kB). An interpreter whose bytecode is another
#: (upgraded since install), or a code file gone, runs the full gate, as shims before did.
_SHIM = """#!{python} -IS
# gridgate gate shim for {name}: runs the real {name} through the token gate.
# Written by `gridgate gate --install-shims`; rewrite it with the same command.
# {code_name}: gridgate's plugins/lsf_proxy/gate/shim.py, compiled for this interpreter.
import marshal
import sys

CONF = {conf!r}
try:
    with open({code_path!r}, "rb") as f:
        CODE = f.read()
except OSError:
    CODE = b""
if CODE[:4] == getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None):
    exec(marshal.loads(CODE[4:]))
    sys.exit(main(CONF))
# no code file, or another interpreter than the one it was compiled for: the full gate
gridgate = sys.modules["gridgate"] = type(sys)("gridgate")
gridgate.__path__ = CONF["roots"]
from gridgate.plugins.lsf_proxy.gate.gating import shim_main

sys.exit(shim_main(CONF["name"], CONF["real"], CONF["shim_dir"], config=CONF["config"],
                   socket=CONF["socket"] or None, snap=CONF["snap"]))
"""

#: The shims' compiled code beside them: ``.gridgate-shim-DIGEST.code`` (the bytecode's magic
#: number, then :mod:`marshal`'s form of shim.py's code).
CODE_PREFIX = ".gridgate-shim-"
CODE_SUFFIX = ".code"


def shim_code() -> bytes:
    """:mod:`.shim` compiled for this interpreter: its magic number, then the marshalled code."""
    origin = os.path.abspath(lean.__file__ or "")
    source = Path(origin).read_text(encoding="utf-8")
    code = compile(source, origin, "exec", dont_inherit=True, optimize=2)
    return importlib.util.MAGIC_NUMBER + marshal.dumps(code)


def code_name(code: bytes) -> str:
    """The file name of ``code`` beside the shims: a new gridgate writes a new file, so that
    shims written before it keep the code they were written with."""
    return f"{CODE_PREFIX}{hashlib.sha256(code).hexdigest()[:16]}{CODE_SUFFIX}"


def shim_settings(
    name: str, real: str | None, shim_dir: str, config: str | None, socket_path: str | None
) -> dict[str, Any]:
    """What the shim for ``name`` needs at run time, resolved now: Python literals only
    (it is written into the shim with ``repr``)."""
    snap = snapshot(name, config)
    section = snap["section"]
    own = {n for names in (section["categories"] or {}).values() for n in names}
    words = (
        {}
        if name in own
        else {word: row.category for word, row in BY_FIRST_WORD.get(name, {}).items()}
    )
    table = {**START_ONLY, **{k: tuple(v) for k, v in (section["start_only"] or {}).items()}}
    flags = table.get(name)

    def request(category: str) -> str:
        # the acquire line up to its size, the one value known only at run time (kept last)
        line = json.dumps(
            {
                "v": PROTOCOL_VERSION,
                "id": 1,
                "op": "acquire",
                "category": category,
                "opcode": name,
                "size": 0,
            },
            separators=(",", ":"),
        )
        return line[: -len("0}")]

    return {
        "name": name,
        "real": real,
        "shim_dir": shim_dir,
        "config": config,
        "snap": snap,
        "roots": _package_roots(),
        "socket": absolute_socket(socket_path) if socket_path else "",
        "default_socket": section["socket"],
        "hosts": [(str(h["name"]), str(h["address"])) for h in section["hosts"] or []],
        "category": snap["category"],
        "words": words,
        "request": {c: request(c) for c in {snap["category"], *words.values()}},
        "start_only": None if flags is None else list(flags),
        "start_hold": float(section["start_hold"]),
        "connect_timeout": float(section["client_timeout"]),
        "reply_timeout": float(section["token_wait_time"]) + 15.0,
        "notoken_ntries": section["notoken_ntries"],
        "when_unavailable": section["when_unavailable"],
        "submits": name in SUBMITTING,
        "nice_caller": bool(section["nice_caller"]),
    }


def shim_text(conf: dict[str, Any], code_file: str) -> str:
    """The shim of :func:`shim_settings` ``conf``: a script of its settings that runs the code
    in ``code_file`` (a :func:`code_name` in its ``shim_dir``), importing nothing it need not."""
    return _SHIM.format(
        python=sys.executable,
        name=conf["name"],
        conf=conf,
        code_name=code_file,
        code_path=os.path.join(conf["shim_dir"], code_file),
    )


def _package_roots() -> list[str]:
    """The directories holding gridgate's ``core`` and ``plugins`` packages (one in a normal
    install, the source tree in an editable one)."""
    roots = []
    for package in (gridgate.core, gridgate.plugins):
        root = os.path.dirname(os.path.dirname(os.path.abspath(package.__file__ or "")))
        if root not in roots:
            roots.append(root)
    return roots


#: ``--shim-kind``: ``compiled`` (:mod:`.compiled`: no interpreter per call; the Python shim
#: beside it for the rest), ``python`` (:mod:`.shim` only), ``auto`` (compiled when a C
#: compiler is on PATH).
SHIM_KINDS = ("auto", "compiled", "python")


def install_shims(
    shim_dir: Path,
    commands: Sequence[str] = (),
    config: str | None = None,
    socket_path: str | None = None,
    kind: str = "auto",
) -> list[tuple[str, str | None, str]]:
    """Write a wrapper per command into ``shim_dir``; return (name, real path or None, the
    kind written: ``compiled`` or ``python``).

    Without ``commands``, every known batch command found on PATH (outside ``shim_dir``) gets
    one. A named command not found now is resolved on PATH, outside ``shim_dir``, when it runs.
    The config's settings are resolved now and kept in the shim with the file's identity; a
    shim finds the file changed at run time and reads it again. ``kind`` is one of
    :data:`SHIM_KINDS`; a compiled shim is written only where it can ask the daemons itself
    (Unix sockets named by absolute paths), the Python shim elsewhere.

    :raises compiled.CompileError: ``kind`` compiled, and no compiler or it failed.
    """
    if kind not in SHIM_KINDS:
        raise ValueError(f"not a shim kind: {kind!r} (one of {', '.join(SHIM_KINDS)})")
    cc = compiled.compiler() if kind != "python" else None
    source = compiled.source() if cc is not None else b""  # read once for every shim
    if kind == "compiled" and cc is None:
        raise compiled.CompileError("--shim-kind compiled: no C compiler (cc or gcc) on PATH")
    shim_dir = Path(shim_dir)
    shim_dir.mkdir(parents=True, exist_ok=True)
    st = shim_dir.stat()
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
        # whoever may write there could replace the shims every user runs, or plant a link
        # where a shim is about to be written
        raise ValueError(
            f"{shim_dir}: group or others may write it, or it belongs to another "
            "user: shims go in a folder only its owner (or root) may change"
        )
    names = list(commands) or [c for c in SHIM_COMMANDS if find_real(c, shim_dir)]
    config = str(Path(config).resolve()) if config else None
    for name in names:
        if not name or "/" in name or name in (".", "..") or name.startswith(CODE_PREFIX):
            raise ValueError(f"not a command name: {name!r}")
    code = shim_code()
    code_file = code_name(code)
    folder = str(shim_dir.resolve())
    # every shim built before any is written: a compiler that fails leaves the folder as it was
    built = []
    for name in names:
        real = find_real(name, shim_dir)
        conf = shim_settings(name, real, folder, config, socket_path)
        text = shim_text(conf, code_file).encode("utf-8")
        binary = None
        if cc is not None:
            fallback = os.path.join(folder, compiled.fallback_name(name))
            settings = compiled.header(conf, fallback)
            if settings is not None:
                binary = compiled.build(settings, cc, source)
        built.append((name, real, text, binary))
    # the code first: a shim is never there before the file it reads
    atomic_write(shim_dir / code_file, code, mode=0o644, durable=False)
    written = []
    for name, real, text, binary in built:
        fallback_path = shim_dir / compiled.fallback_name(name)
        if binary is None:
            atomic_write(shim_dir / name, text, mode=0o755, durable=False)
            fallback_path.unlink(missing_ok=True)  # a compiled shim's, written before
            written.append((name, real, "python"))
            continue
        # the Python shim first: a compiled shim is never there before the file it execs
        atomic_write(fallback_path, text, mode=0o755, durable=False)
        atomic_write(shim_dir / name, binary, mode=0o755, durable=False)
        written.append((name, real, "compiled"))
    _drop_unused_code(shim_dir)
    return written


def _drop_unused_code(shim_dir: Path) -> None:
    """Remove the code files (:data:`CODE_PREFIX`) no shim of ``shim_dir`` names any more:
    those of a gridgate whose shims have all been written again."""
    named: set[str] = set()
    codes = []
    for entry in os.scandir(shim_dir):
        if entry.name.startswith(CODE_PREFIX):
            codes.append(entry.name)
        elif entry.is_file(follow_symlinks=False):
            try:
                with open(entry.path, "rb") as f:
                    head = f.read(4096)  # a shim names its code in its fourth line
            except OSError:
                continue
            if head.startswith(b"#!") and b"gridgate gate shim" in head:
                prefix = CODE_PREFIX.encode()
                named.update(w.rstrip(b":").decode() for w in head.split() if w.startswith(prefix))
    for name in codes:
        if name not in named:
            try:
                os.unlink(shim_dir / name)
            except FileNotFoundError:
                pass  # another install removed it


@click.command("gate", context_settings={"allow_interspersed_args": False})
@click.option(
    "--category",
    type=click.Choice(CATEGORIES),
    help="Token category (default: inferred from the command name).",
)
@click.option("--opcode", help="Opcode reported to the daemon (default: the command name).")
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    help="The daemon's Unix socket (default: $GRIDGATE_PROXYD_SOCKET, the config, the "
    "runtime directory).",
)
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Site config with a proxyd: section (hosts, key, notoken_ntries...).",
)
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="Say nothing while waiting for a token (also: $GRIDGATE_GATE_QUIET=1).",
)
@click.option(
    "--install-shims",
    "shim_dir",
    type=click.Path(file_okay=False),
    help="Write wrappers for batch commands into this directory and exit.",
)
@click.option(
    "--shim",
    "shim_commands",
    multiple=True,
    metavar="NAME",
    help="With --install-shims: wrap this command (repeatable; default: every known "
    "batch command found on PATH).",
)
@click.option(
    "--shim-kind",
    type=click.Choice(SHIM_KINDS),
    default="auto",
    show_default=True,
    help="With --install-shims: compiled (no interpreter per call; needs a C compiler), "
    "python, or auto (compiled when cc or gcc is on PATH).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def gate_command(
    category: str | None,
    opcode: str | None,
    socket_path: str | None,
    config_path: str | None,
    quiet: bool,
    shim_dir: str | None,
    shim_commands: tuple[str, ...],
    shim_kind: str,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND under a token from lsfproxyd: gridgate gate -- bjobs -u all

    Exit status: the command's own; 75 when no token was granted (the command did not run),
    69 when no daemon answered and when_unavailable is fail, 126/127 when it cannot run.
    """
    if shim_dir:
        if command:
            raise click.UsageError("--install-shims takes no command")
        try:
            written = install_shims(
                Path(shim_dir), shim_commands, config_path, socket_path, shim_kind
            )
        except (OSError, ValueError, compiled.CompileError) as exc:
            say(str(exc))
            raise SystemExit(1) from None
        for name, real, kind in written:
            target = real or "(looked up on PATH when run)"
            click.echo(f"{Path(shim_dir) / name} -> {target} ({kind})")
        if not written:
            say("no batch command found on PATH; name them with --shim NAME")
        return
    if not command:
        raise click.UsageError("give a command: gridgate gate -- COMMAND ARGS...")
    raise SystemExit(gate_call(command, category, opcode, socket_path, config_path, quiet))


class Commands:
    """Adds ``gridgate gate`` (entry point ``gridgate.cli: lsf_gate``)."""

    @hookimpl
    def gridgate_register_commands(self, cli: click.Group) -> None:
        cli.add_command(gate_command)
