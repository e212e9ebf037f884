"""Writes the plugin authors' references from the code itself, so they cannot drift from it:
docs/kinds.md (the failure-kind catalogue), docs/hooks.md (the hook specifications) and
docs/api.md (what a plugin may import).

``gridgate docs`` writes them (:mod:`.docs`, with the other generated pages); ``gridgate docs
--check`` exits 1 when one is stale.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REGENERATE = "gridgate docs"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def render_kinds() -> str:
    from gridgate.core import kinds

    lines = [
        "# Failure kinds",
        "",
        "<!-- generated from gridgate.core.kinds by `gridgate docs`; do not edit -->",
        "",
        "Every failed submission or list-match is given a **kind** by the classifiers (a",
        "backend's own first, the site's `rules` and the generic kinds last). The kind's flags",
        "decide what the director does:",
        "",
        "- **excluded**: the server is taken out of rotation for the rest of the iteration and put",
        "  in the failing cache for `failing_expiry` seconds (core's, whichever escalation plugin",
        "  is configured); the escalation plugin then decides who is told;",
        "- **notified**: people are told: an error for the first failure of an episode;",
        "- **alarms**: a server that fails again within the tickets window raises an alarm",
        '  ("Submit GGUS Ticket"); only kinds that are excluded and notified can, and `config`',
        "  never does (the site must fix it: repeated failures are errors again);",
        "- **retried elsewhere**: the submission is sent to another usable server in the same",
        "  iteration (`director.retries_per_pilot`, within `director.retry_within_seconds`);",
        "- **local**: the fault is on the director's machine: no server is blamed, the backend is",
        "  paused for the rest of the iteration, and one error per `failing_expiry` names what to",
        "  fix.",
        "",
        "The site can change whether a kind is notified with `director.notify_kinds`.",
        "",
        *kinds.markdown_table(),
        "",
        "Backends and classifiers build these with `gridgate.core.kinds.failure(kind, reason)`",
        "(or `KINDS[kind].failure(reason, notify=...)` to vary a flag), so their answers agree",
        "with this table. `gridgate plugins --kinds` prints it.",
        "",
        "## Kinds of your own",
        "",
        "A classifier may answer with a kind that is not in the catalogue (`quota`, `license`):",
        "it works. The director acts on that `Failure`'s own `exclude`, `notify`, `transient`",
        "and `local`, and the kind appears under its own name in accounting, metrics, `--json`",
        "and the notification subject. It is not listed by `gridgate plugins --kinds`. Prefer a",
        "catalogued kind when one fits, so that site rules (`notify_kinds`) and reports read",
        "the same across backends; the backend contract tests",
        "(`gridgate.core.testing.BackendContract`) ask for catalogued kinds unless the backend",
        "declares its own in `extra_kinds`.",
        "",
        "## Words in the accounting table that are not failures",
        "",
        "`failure_kind` of an attempt that reached no server is one of:",
        "",
        "| word | meaning |",
        "|---|---|",
        *(f"| `{word}` | {meaning} |" for word, meaning in kinds.OUTCOME_KINDS.items()),
        "",
    ]
    return "\n".join(lines)


# --- docstrings ---------------------------------------------------------------------------

_ROLE = re.compile(r":(?:class|func|meth|data|mod|attr|exc):`~?([^`]+)`")
_FIELD = re.compile(r"^:(param|raises|return|returns)\s*([^:]*):\s*(.*)$")


def _md(text: str) -> str:
    """reStructuredText inline markup as Markdown: ``x`` and :class:`x` become `x`."""
    text = _ROLE.sub(
        lambda m: f"``{m.group(1).rsplit('.', 1)[-1] if '~' in m.group(0) else m.group(1)}``", text
    )
    return text.replace("``", "`")


@dataclasses.dataclass
class Doc:
    """A docstring split into its prose and its ``:param:``/``:return:``/``:raises:`` fields."""

    prose: list[str]
    params: dict[str, str]
    returns: str
    raises: list[tuple[str, str]]


def parse_doc(obj: Any) -> Doc:
    doc = Doc([], {}, "", [])
    current: list[str] | None = None
    target: tuple[str, str] | None = None

    def close() -> None:
        nonlocal current, target
        if current is not None and target is not None:
            text = _md(" ".join(current))
            kind, name = target
            if kind == "param":
                doc.params[name] = text
            elif kind in ("return", "returns"):
                doc.returns = text
            else:
                doc.raises.append((name, text))
        current, target = None, None

    for line in (inspect.getdoc(obj) or "").splitlines():
        match = _FIELD.match(line.strip())
        if match:
            close()
            target = (match.group(1), match.group(2).strip())
            current = [match.group(3)]
        elif current is not None and line.strip():
            current.append(line.strip())
        else:
            close()
            doc.prose.append(_md(line))
    close()
    while doc.prose and not doc.prose[-1].strip():
        doc.prose.pop()
    return doc


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _annotation(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return ""
    return value if isinstance(value, str) else getattr(value, "__name__", str(value))


# --- docs/hooks.md --------------------------------------------------------------------------


def hookspecs() -> list[Any]:
    """The hook specifications in the order they are declared."""
    from gridgate.core import hookspecs as module

    specs = [
        obj
        for name, obj in vars(module).items()
        if name.startswith("gridgate_") and hasattr(obj, "gridgate_spec")
    ]
    return sorted(specs, key=lambda fn: fn.__code__.co_firstlineno)


def render_hooks() -> str:
    from gridgate.core import API_VERSION

    lines = [
        "# Hook reference",
        "",
        "<!-- generated from gridgate.core.hookspecs by `gridgate docs`; do not edit -->",
        "",
        f"Plugin API version **{API_VERSION}** (`gridgate.core.API_VERSION`; what it promises is in",
        "[api.md](api.md#versions-and-deprecation)). Implement a hook as a method of the same",
        "name decorated with `@hookimpl` (`from gridgate.core import hookimpl`); name only the",
        "parameters you use, pluggy passes those. The engine always calls hooks with keyword",
        "arguments. The types are in [api.md](api.md).",
        "",
        "- **firstresult**: a decision. Plugins are asked in config order (the built-in defaults",
        "  last) and the first answer that is not None wins, so return None for what is not yours.",
        "- **broadcast**: an event. Every plugin that implements it is called; the return value is",
        "  ignored.",
        "",
        "| hook | kind | returns |",
        "|---|---|---|",
    ]
    specs = hookspecs()
    for fn in specs:
        kind = "firstresult" if fn.gridgate_spec.get("firstresult") else "broadcast"
        returns = _annotation(inspect.signature(fn).return_annotation)
        lines.append(f"| [`{fn.__name__}`](#{fn.__name__}) | {kind} | `{_cell(returns)}` |")
    for fn in specs:
        signature = inspect.signature(fn)
        doc = parse_doc(fn)
        kind = "firstresult" if fn.gridgate_spec.get("firstresult") else "broadcast"
        params = ", ".join(
            f"{name}: {_annotation(p.annotation)}" for name, p in signature.parameters.items()
        )
        lines += [
            "",
            f"## {fn.__name__}",
            "",
            "```python",
            f"@hookimpl\ndef {fn.__name__}(self, {params}) -> {_annotation(signature.return_annotation)}: ...",
            "```",
            "",
            f"**{kind}**. " + (doc.prose[0] if doc.prose else ""),
            *doc.prose[1:],
            "",
        ]
        lines += ["| parameter | type | meaning |", "|---|---|---|"]
        for name, parameter in signature.parameters.items():
            lines.append(
                f"| `{name}` | `{_cell(_annotation(parameter.annotation))}` | {_cell(doc.params.get(name, ''))} |"
            )
        lines += ["", f"**Returns** `{_annotation(signature.return_annotation)}`: {doc.returns}"]
    lines.append("")
    return "\n".join(lines)


# --- docs/api.md ----------------------------------------------------------------------------

#: Every public module (each module directly in core/), in the order api.md shows them, with what
#: it is for. What a module offers is its ``__all__``; a name not in one is internal and may change
#: in any release.
API: tuple[tuple[str, str], ...] = (
    (
        "gridgate.core",
        "The hook marker and the plugin API's version.",
    ),
    (
        "gridgate.core.plugins",
        "The base class of a plugin and the services it is given.",
    ),
    (
        "gridgate.core.settings",
        "A config section read once and typed: a frozen dataclass per section whose defaults come only from its JSON Schema, and its cross-key rules.",
    ),
    (
        "gridgate.core.backend",
        "The base class of a backend: answers the hooks for its own endpoints only, builds `BackendInfo` from the section (with the pilot resources it maps), runs commands with the call's deadline and output cap; `Outages` for endpoints sharing one controller.",
    ),
    (
        "gridgate.core.model",
        "The values that cross hooks: all frozen dataclasses except `DemandRegistry` (derive a changed copy with `dataclasses.replace`).",
    ),
    (
        "gridgate.core.scheduler",
        "What a scheduler's controller tells the token daemon: the RPCs it served, the requests it logged, a user refused or admitted again (the scheduler hooks' answers).",
    ),
    (
        "gridgate.core.hookspecs",
        "The hook specifications: each documented in [hooks.md](hooks.md).",
    ),
    (
        "gridgate.core.runner",
        "Running external commands: an argv list, a hard deadline, output capped, a result in every case.",
    ),
    (
        "gridgate.core.kinds",
        "The catalogue of failure kinds (see [kinds.md](kinds.md)).",
    ),
    (
        "gridgate.core.patterns",
        "A pattern table: the lines a backend's commands print, and the catalogued failure each one means.",
    ),
    (
        "gridgate.core.watchdog",
        "A private service (a test cluster, a CE) brought down when the process that started it dies.",
    ),
    (
        "gridgate.core.credentials",
        "Credential plugins: the base class a plugin for a credential in a file subclasses (a token file, see [plugins.md](plugins.md)), and `x509_proxy`.",
    ),
    (
        "gridgate.core.credential_names",
        "Named credentials: the key that names one (`credential: NAME`) and which one a submission uses (the nearest level wins).",
    ),
    (
        "gridgate.core.fitting",
        "What each endpoint can run (`endpoint_resources`) and which pilots fit it: what the director, a selector or a demand plugin asks before sending a requirement somewhere.",
    ),
    (
        "gridgate.core.endpoint_state",
        "What an endpoint's queue says of itself (`gridgate_endpoint_state`): the typed figures, and a cache so that one read of a cluster or a CE answers for all its endpoints a while.",
    ),
    (
        "gridgate.core.files",
        "Files someone else picks up, and the private folders they live in.",
    ),
    (
        "gridgate.core.cutoff",
        "A wall-clock deadline over a whole exchange with a library that only has per-read timeouts (smtplib, redis-py, a socket).",
    ),
    (
        "gridgate.core.text",
        "Text from outside (a CE, a feed, a pilot's stderr): JSON and YAML whose every bad document is a `ValueError`, and escaping before people read it.",
    ),
    (
        "gridgate.core.documents",
        "The boundary for documents from outside (CE answers, tokens, scheduler tables, feeds, store records): decoded once into typed values, every bad one a `DocumentError`, fixed-width rows read by their producer's format.",
    ),
    (
        "gridgate.core.clock",
        "Time, injected: use `context.clock`, never `time.time()`.",
    ),
    (
        "gridgate.core.config",
        "Loading a config file, and the config errors.",
    ),
    (
        "gridgate.core.http",
        "HTTP for every plugin (feeds, REST services, CEs): one client, urllib3 underneath, "
        "with a wall-clock deadline over each whole exchange, a size cap and verified TLS.",
    ),
    (
        "gridgate.core.secrets",
        "The same secrets without the config machinery, for code on a start-up path (a shim that must start fast).",
    ),
    (
        "gridgate.core.outbox",
        "The durable outbox any notifier can use: a crash-safe directory queue with pluggable transports, retry with backoff and dead-letter, shown by `gridgate outbox`.",
    ),
    (
        "gridgate.core.mail",
        "E-mail from notifications: the SMTP keys of a section and the SMTP transport of an outbox.",
    ),
    (
        "gridgate.core.defaults",
        "What the built-in defaults give a backend.",
    ),
    (
        "gridgate.core.state",
        "The shared state store (`context.state`) and its pilot registry (`context.state.pilot_registry()`), the base of a state driver, and opening the store a config names.",
    ),
    (
        "gridgate.core.journal",
        "Changes to outside state that must be undone (a partition's groups, a block, a debug flag), journaled in the state store first: the intent and each prior value before the change, an undo that puts back only what the change set and is still in force.",
    ),
    (
        "gridgate.core.weights",
        "Weighted endpoint choice for a selector: the backend's `weights` times the availability factor, a weighted random choice, smooth weighted round robin.",
    ),
    (
        "gridgate.core.failing",
        "The failing cache and the servers' failure episodes (`context.failing`): who is out of rotation, since when, how many failures; whichever escalation plugin is configured.",
    ),
    (
        "gridgate.core.cli",
        "For plugins that add sub-commands.",
    ),
    (
        "gridgate.core.metrics",
        "Serving a plugin's own Prometheus registry over HTTP.",
    ),
    (
        "gridgate.core.testing",
        "The testing kit (needs pytest only for its fixtures and the contract suite).",
    ),
)


def api_names() -> Iterator[tuple[str, str, tuple[str, ...]]]:
    """(module, what it is for, its ``__all__``) of every public module."""
    for module_name, purpose in API:
        module = importlib.import_module(module_name)
        yield module_name, purpose, tuple(module.__all__)


def deprecated_names(module_name: str) -> dict[str, str]:
    """The names of ``module_name``'s ``__all__`` kept for API 1.4 code only, each with the
    module it moved to (``gridgate.core.MOVED_NAMES``)."""
    from gridgate import core

    short = module_name.rpartition(".")[2]
    return {
        name: f"gridgate.core.{target}"
        for name, target in core.MOVED_NAMES.get(short, {}).items()
        if name in getattr(importlib.import_module(module_name), "__all__", ())
    }


def _public_members(cls: type) -> Iterator[tuple[str, Any]]:
    for name, member in vars(cls).items():
        if name.startswith("_") or name in {"config_schema", "name"}:
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if callable(member) or isinstance(member, property):
            yield name, member


def _render_object(module_name: str, name: str, obj: Any) -> list[str]:
    lines = ["", f"### `{name}`", ""]
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        lines += [
            f"`from {module_name} import {name}` — dataclass"
            + (" (frozen)" if obj.__dataclass_params__.frozen else ""),  # type: ignore[attr-defined]
            "",
        ]
        doc = parse_doc(obj)
        lines += [*doc.prose, "", "| field | type | default |", "|---|---|---|"]
        for f in dataclasses.fields(obj):
            if f.default is not dataclasses.MISSING:
                default = f"`{f.default!r}`"
            elif f.default_factory is not dataclasses.MISSING:
                default = "empty"
            else:
                default = "*required*"
            lines.append(f"| `{f.name}` | `{_cell(_annotation(f.type))}` | {_cell(default)} |")
        lines += _members(obj)
    elif inspect.isclass(obj):
        lines += [f"`from {module_name} import {name}` — class", "", *parse_doc(obj).prose]
        if not issubclass(obj, BaseException) and "__init__" in vars(obj):
            lines += ["", f"`{name}{_signature(obj.__init__, drop_self=True)}`"]
        lines += _members(obj)
    elif callable(obj) and not isinstance(obj, type(importlib)) and inspect.isfunction(obj):
        lines += _function(module_name, name, obj)
    else:
        if (
            isinstance(obj, (str, int, float, tuple, frozenset))
            or getattr(obj, "__module__", "") == "typing"
        ):
            value = f"frozenset({sorted(obj)!r})" if isinstance(obj, frozenset) else repr(obj)
            shown = "`" + _cell(value if len(value) <= 100 else value[:97] + "...") + "`"
        elif isinstance(obj, dict):
            shown = f"a `dict` of {len(obj)} entries"
        else:
            shown = f"an instance of `{type(obj).__name__}`"
        lines += [f"`from {module_name} import {name}` — {shown}", ""]
        described = _constant_doc(module_name, name) or _NOTES.get(f"{module_name}.{name}", "")
        if described:
            lines.append(described)
    return lines


def _signature(fn: Any, drop_self: bool = False) -> str:
    signature = inspect.signature(fn)
    if drop_self:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return str(signature).replace("'", "")


def _function(module_name: str, name: str, fn: Any) -> list[str]:
    doc = parse_doc(fn)
    lines = [
        f"`from {module_name} import {name}`",
        "",
        "```python",
        f"{name}{_signature(fn)}",
        "```",
        "",
        *doc.prose,
    ]
    if doc.params:
        lines += ["", "| parameter | meaning |", "|---|---|"]
        lines += [f"| `{p}` | {_cell(text)} |" for p, text in doc.params.items()]
    if doc.returns:
        lines += ["", f"**Returns**: {doc.returns}"]
    for exc, text in doc.raises:
        lines += ["", f"**Raises** `{exc}`: {text}"]
    return lines


def _members(cls: type) -> list[str]:
    rows = []
    for member_name, member in _public_members(cls):
        if isinstance(member, property):
            first = (parse_doc(member.fget).prose or [""])[0]
            rows.append(f"| `.{member_name}` (property) | {_cell(first)} |")
        else:
            first = (parse_doc(member).prose or [""])[0]
            rows.append(
                f"| `.{member_name}{_cell(_signature(member, drop_self=True) if _has_self(member) else _signature(member))}` | {_cell(first)} |"
            )
    return ["", "| member | what it does |", "|---|---|", *rows] if rows else []


def _has_self(fn: Any) -> bool:
    params = list(inspect.signature(fn).parameters)
    return bool(params) and params[0] in ("self", "cls")


#: What a name made on first use (a module ``__getattr__``) is for, having no ``#:`` comment.
_NOTES = {
    "gridgate.core.hookimpl": "Decorate a plugin method with this to implement a hook (`@hookimpl`)."
}


def _constant_doc(module_name: str, name: str) -> str:
    """The ``#:`` comment above a module constant, if any."""
    source = inspect.getsource(importlib.import_module(module_name))
    match = re.search(rf"((?:^#:.*\n)+)^{re.escape(name)}\b", source, re.M)
    if not match:
        return ""
    return _md(" ".join(line[2:].strip() for line in match.group(1).splitlines()))


def render_api() -> str:
    from gridgate.core import API_VERSION

    lines = [
        "# Plugin API reference",
        "",
        "<!-- generated by `gridgate docs`; do not edit -->",
        "",
        f"Plugin API version **{API_VERSION}**. This page lists everything a plugin may import",
        "from gridgate; anything else is internal and may change in any release. The hooks",
        "themselves are in [hooks.md](hooks.md), the failure kinds in [kinds.md](kinds.md), and",
        "how to write each kind of plugin in [plugins.md](plugins.md).",
        "",
        "## Versions and deprecation",
        "",
        "`gridgate.core.API_VERSION` is `MAJOR.MINOR`; a plugin may check it at import. Between",
        "releases gridgate promises:",
        "",
        "- **MINOR** goes up when something is **added**: a new hook, a new optional field at the end",
        "  of a value (with a default), a new keyword argument with a default, a new name on this",
        "  page, a new failure kind. A plugin written for `1.x` works unchanged on any later `1.y`.",
        "- **MAJOR** goes up when something a plugin uses **changes or goes away**: a hook's",
        "  parameters or meaning, a field's type, a name removed from this page.",
        "- Nothing is removed without a deprecation first: the name or parameter keeps working for",
        "  at least one MINOR release while it logs a `DeprecationWarning` naming its replacement,",
        "  and this page marks it deprecated. It goes away only with the next MAJOR.",
        "- The hook specifications and the values that cross them are fingerprinted in gridgate's",
        "  own tests (`core/devkit/api_fingerprint.txt`): changing them without changing the version",
        "  fails the build.",
        "",
        "Every module directly in `gridgate.core` is on this page, and what it offers is exactly its",
        "`__all__`; the sub-packages (`engine`, `builtin`, `stores`, `commands`, `devkit`) are",
        "internal. The paths of API 1.4 that moved into them in 1.5 still import, with a",
        "`DeprecationWarning` naming the new place, until 2.0.",
        "",
        "## A plugin as API 1.7 writes it",
        "",
        "Its section's schema is the one place a default is written; a `Settings` dataclass reads",
        "the section once, typed (`self.settings`); what it reads from outside is decoded once into",
        "types (`gridgate.core.documents`). `self.config` stays for plugins written for 1.6 and",
        "before, which keep working unchanged ([plugins.md](plugins.md) says more).",
        "",
        "```python",
        "from dataclasses import dataclass",
        "",
        "import msgspec",
        "",
        "from gridgate.core import hookimpl",
        "from gridgate.core.documents import decode_json",
        "from gridgate.core.plugins import Plugin",
        "from gridgate.core.settings import Settings",
        "",
        "SCHEMA = {",
        '    "type": "object",',
        '    "additionalProperties": False,',
        '    "properties": {',
        '        "url": {"type": "string", "description": "Where the queue answers."},',
        '        "timeout": {"type": "number", "default": 30, "description": "Seconds."},',
        "    },",
        '    "required": ["url"],',
        "}",
        "",
        "",
        "@dataclass(frozen=True)",
        "class QueueSettings(Settings):  # one field per property, no defaults here",
        "    url: str",
        "    timeout: float",
        "",
        "",
        "class Answer(msgspec.Struct):  # what the queue answers, checked while it is parsed",
        "    waiting: int",
        "",
        "",
        "class QueueDemand(Plugin):",
        "    config_schema = SCHEMA",
        "    settings_class = QueueSettings",
        "    settings: QueueSettings",
        "",
        "    @hookimpl",
        "    def gridgate_demand(self, iteration, demand):",
        "        body = fetch(self.settings.url, timeout=self.settings.timeout)",
        '        answer = decode_json(body, Answer, kind="queue answer")  # DocumentError if bad',
        "        ...",
        "```",
        "",
        "## Contents",
        "",
    ]
    body: list[str] = []
    for module_name, purpose, names in api_names():
        anchor = module_name.replace(".", "")
        lines.append(f"- [`{module_name}`](#{anchor}): " + ", ".join(f"`{n}`" for n in names))
        module = importlib.import_module(module_name)
        body += ["", f"## `{module_name}`", "", purpose]
        moved = deprecated_names(module_name)
        for name in names:
            if module_name == "gridgate.core.hookspecs":
                body += ["", f"- [`{name}`](hooks.md#{name})"]
            elif name in moved:
                body += [
                    "",
                    f"### `{name}`",
                    "",
                    f"**Deprecated** since API 1.5, goes at 2.0: `from {module_name} import {name}` "
                    f"still works with a `DeprecationWarning`; it is now `{moved[name]}.{name}`, "
                    "an internal module.",
                ]
            else:
                body += _render_object(module_name, name, getattr(module, name))
    lines += body
    lines.append("")
    # a default that is an object or a function prints with its address, which changes from
    # run to run: show its class, or the function's name, instead
    text = re.sub(r"<(?:[\w]+\.)*(\w+) object at 0x[0-9a-f]+>", r"\1()", "\n".join(lines))
    return re.sub(r"<function ([\w.]+) at 0x[0-9a-f]+>", r"\1", text)


# --- the API's fingerprint -------------------------------------------------------------------

FINGERPRINT_FILE = Path(__file__).resolve().parent / "api_fingerprint.txt"


def api_fingerprint() -> str:
    """A hash of what a plugin is promised: every hook's name, kind and signature, and every
    field of every value in :mod:`gridgate.core.model` and :mod:`gridgate.core.scheduler`
    (name, type, default), in one list sorted by name (the second split from the first in API
    1.12 and hashes as it did there)."""
    import hashlib

    from gridgate.core import model, scheduler

    parts = []
    for fn in hookspecs():
        parts.append(
            f"hook {fn.__name__} firstresult={bool(fn.gridgate_spec.get('firstresult'))} "
            f"{inspect.signature(fn)}"
        )
    homes = {name: module for module in (model, scheduler) for name in module.__all__}
    for name in sorted(homes):
        obj = getattr(homes[name], name)
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
            fields = ", ".join(
                f"{f.name}: {f.type} = {_default(f)}" for f in dataclasses.fields(obj)
            )
            parts.append(f"value {name}({fields})")
        else:
            parts.append(f"name {name}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    return "<factory>" if f.default_factory is not dataclasses.MISSING else "<required>"


def recorded_fingerprints(path: Path = FINGERPRINT_FILE) -> dict[str, str]:
    """``API_VERSION -> fingerprint`` as recorded, one ``VERSION HASH`` line each."""
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        if line.strip() and not line.startswith("#"):
            version, digest = line.split()
            out[version] = digest
    return out


def record_fingerprint(path: Path = FINGERPRINT_FILE) -> str:
    """Record the current fingerprint for the current ``API_VERSION``; refuses to change the
    fingerprint of a version already recorded (bump the version instead)."""
    from gridgate.core import API_VERSION

    current = api_fingerprint()
    known = recorded_fingerprints(path)
    if known.get(API_VERSION) not in (None, current):
        raise SystemExit(
            f"API {API_VERSION} was recorded with another fingerprint: the hooks or "
            "values changed, so raise gridgate.core.API_VERSION (docs/api.md says how) "
            "and record again"
        )
    if API_VERSION not in known:
        header = (
            ""
            if path.exists()
            else "# gridgate plugin API: VERSION FINGERPRINT (gridgate docs --fingerprint)\n"
        )
        with path.open("a", encoding="utf-8") as out:
            out.write(f"{header}{API_VERSION} {current}\n")
    return current


#: file name -> renderer
RENDERERS: dict[str, Callable[[], str]] = {
    "api.md": render_api,
    "hooks.md": render_hooks,
    "kinds.md": render_kinds,
}
