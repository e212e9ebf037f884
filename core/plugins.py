"""Finds plugins through entry points (stevedore) and registers them with pluggy.

Only the plugins a config names are loaded; the built-in defaults are loaded the same way and
answer last (their hook implementations are ``trylast``). A configured name that is not
installed or fails to import is a :class:`PluginLoadError` naming the group, the name and the
cause; never a silent skip.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pluggy
from loguru import logger

from gridgate.core import PROJECT, hookspecs
from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.runner import DEFAULT_MAX_OUTPUT

if TYPE_CHECKING:
    from gridgate.core.failing import FailingCache
    from gridgate.core.state import StateStore

#: Config section (top-level YAML key) -> entry-point group. Keys inside each section are
#: entry-point names.
CONFIG_GROUPS: dict[str, str] = {
    "backends": "gridgate.backends",
    "demand": "gridgate.demand",
    "admission": "gridgate.admission",
    "selectors": "gridgate.selectors",
    "classifiers": "gridgate.classifiers",
    "escalation": "gridgate.escalation",
    "notifiers": "gridgate.notifiers",
    "credentials": "gridgate.credentials",
    "availability": "gridgate.availability",
}
#: Other groups: state drivers (chosen by ``state.driver``), extra top-level config sections
#: (``proxyd``...), and command-line providers (loaded whenever ``gridgate`` starts).
STATE_GROUP = "gridgate.state"
SECTIONS_GROUP = "gridgate.sections"
CLI_GROUP = "gridgate.cli"
ALL_GROUPS = (*CONFIG_GROUPS.values(), STATE_GROUP, SECTIONS_GROUP, CLI_GROUP)

#: Built-in defaults, always registered; a config section of the same name configures them.
DEFAULT_PLUGINS: tuple[tuple[str, str], ...] = (
    ("selectors", "random"),
    ("classifiers", "rules"),
    ("escalation", "caches"),
    ("notifiers", "log"),
    ("admission", "all"),
    ("availability", "operator"),
)


class PluginLoadError(Exception):
    """A configured plugin is not installed or could not be imported."""

    def __init__(self, group: str, name: str, cause: str, installed: Iterable[str] = ()) -> None:
        self.group, self.name, self.cause = group, name, cause
        self.installed = sorted(installed)
        hint = f" (installed: {', '.join(self.installed) or 'none'})" if self.installed else ""
        super().__init__(f"plugin {name!r} of group {group}: {cause}{hint}")


@dataclass
class PluginContext:
    """Services a plugin may use, handed to its constructor.

    ``config`` is the whole validated config (read-only by convention); ``state`` the shared
    state store (None for commands that need none); ``state_dir`` where plugins keep files;
    ``failing`` the failing cache and the servers' failure episodes
    (:class:`gridgate.core.failing.FailingCache`, on ``state`` with the expiries of the
    config's ``director`` section when not given; None without a state store): an escalation
    plugin reads the episode there, a backend asks whether a server's failure persists.
    """

    clock: Clock = SYSTEM_CLOCK
    state: StateStore | None = None
    state_dir: Path = field(default_factory=lambda: Path("gridgate-state"))
    config: Mapping[str, Any] = field(default_factory=dict)
    config_path: Path | None = None
    failing: FailingCache | None = None

    def __post_init__(self) -> None:
        # set by build_plugin_manager: the manager of the plugins built with this context
        self._plugin_manager: pluggy.PluginManager | None = None
        if self.failing is None and self.state is not None:
            from gridgate.core.failing import FailingCache

            director = self.config.get("director") or {}
            self.failing = FailingCache.from_config(self.state, self.clock, director)

    def credential_env(self, kind: str) -> dict[str, str]:
        """The environment variables that hand the credential of ``kind`` (``x509``) to a
        command: ``{"X509_USER_PROXY": "/var/lib/gridgate/proxy.pem"}``. Merge them into the
        command's environment (``env={**os.environ, **context.credential_env("x509")}``).

        Answered by the configured credential plugin of that kind from its section, so it works
        in any process that built the plugins from the config, iteration or not. ``{}`` when no
        credential plugin of that kind is configured: the command then runs with whatever its
        environment has, unmanaged.

        :param kind: a kind the backend lists in ``BackendInfo.credentials``.
        """
        if self._plugin_manager is None:
            return {}
        answer = self._plugin_manager.hook.gridgate_credential_env(kind=kind)
        return {str(k): str(v) for k, v in (answer or {}).items()}

    @property
    def max_output_bytes(self) -> int:
        """The site's ``director.max_output_bytes``: pass it to every ``runner.run`` call as
        ``max_output=``. The runner does not read the config itself, so a call without it keeps
        the runner's default (4 MiB per stream)."""
        director = self.config.get("director") or {}
        return int(director.get("max_output_bytes") or DEFAULT_MAX_OUTPUT)


class Plugin:
    """Base class for gridgate plugins (optional: any class with this shape works).

    ``config_schema`` is the JSON Schema (2020-12) of the plugin's own config section; core
    composes it into the file's schema and fills its defaults before the constructor runs.
    ``config_errors`` adds cross-field checks a schema cannot express.
    """

    config_schema: ClassVar[dict[str, Any]] = {"type": "object", "additionalProperties": False}
    name: str = ""
    #: A backend: the key of its section that lists its endpoints (``servers``); a configured
    #: backend whose list is empty is a config error, since it could submit nowhere.
    endpoints_key: ClassVar[str | None] = None

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        self.config = config
        self.context = context

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        """Cross-field problems as (path inside the section, message); empty when fine."""
        return []

    @classmethod
    def config_warnings(cls, section: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        """Legal settings that are probably not meant, as (path, message); `gridgate config
        validate` prints them and still says valid."""
        return []

    def close(self) -> None:
        """Release threads, sockets, files. Called when the config is replaced or at exit."""


def _entry_point_names(group: str) -> list[str]:
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=group)})


def _fresh(manager_class: Any) -> Any:
    """``manager_class`` (a stevedore manager) reading its entry points from the installed
    metadata each time, instead of stevedore's on-disk cache.

    stevedore caches entry points in ``~/.cache/python-entrypoints`` under a hash of the
    ``sys.path`` entries' mtimes packed as 32-bit floats: at today's timestamps that is a
    128-second resolution, so for up to two minutes after an upgrade that adds or moves an
    entry point stevedore hands back the old list (we hit it: ``import failed: ... has no
    attribute 'ProxydSection'`` right after the class moved). ``importlib.metadata`` is what
    stevedore reads underneath; one scan per group per manager costs a few milliseconds.
    Loading, ordering and failure callbacks stay stevedore's.
    """

    class Fresh(manager_class):
        def list_entry_points(self) -> list[importlib.metadata.EntryPoint]:
            return list(importlib.metadata.entry_points(group=self.namespace))

    Fresh.__name__ = f"Fresh{manager_class.__name__}"
    return Fresh


def load_class(group: str, name: str) -> type:
    """Import the class registered as ``name`` in entry-point ``group``.

    :raises PluginLoadError: not installed, or its import failed (the cause is kept).
    """
    from stevedore import NamedExtensionManager  # imported here: the gate's start-up needs none

    failures: list[str] = []

    def on_failure(_manager: Any, ep: Any, err: BaseException) -> None:
        failures.append(f"import failed: {type(err).__name__}: {err}")

    missing: list[str] = []
    manager = _fresh(NamedExtensionManager)(
        namespace=group,
        names=[name],
        invoke_on_load=False,
        on_load_failure_callback=on_failure,
        on_missing_entrypoints_callback=missing.extend,
        name_order=True,
    )
    if failures:
        raise PluginLoadError(group, name, failures[0])
    if missing or not manager.extensions:
        raise PluginLoadError(group, name, "not installed", _entry_point_names(group))
    return manager.extensions[0].plugin


@dataclass(frozen=True)
class InstalledPlugin:
    group: str
    name: str
    target: str
    distribution: str
    version: str
    default: bool


def installed_plugins() -> list[InstalledPlugin]:
    """Every plugin installed in every gridgate group, without importing any of them."""
    defaults = {(CONFIG_GROUPS[key], name) for key, name in DEFAULT_PLUGINS}
    rows = []
    for group in ALL_GROUPS:
        for ep in importlib.metadata.entry_points(group=group):
            dist = getattr(ep, "dist", None)
            rows.append(
                InstalledPlugin(
                    group=group,
                    name=ep.name,
                    target=ep.value,
                    distribution=dist.name if dist else "?",
                    version=dist.version if dist else "?",
                    default=(group, ep.name) in defaults,
                )
            )
    return sorted(rows, key=lambda r: (ALL_GROUPS.index(r.group), r.name))


def configured_plugins(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(config key, name) of every plugin a config asks for, defaults included, in config
    order; a default the config does not mention comes after the configured ones."""
    chosen: list[tuple[str, str]] = []
    for key in CONFIG_GROUPS:
        for name in config.get(key) or {}:
            chosen.append((key, name))
    for default in DEFAULT_PLUGINS:
        if default not in chosen:
            chosen.append(default)
    return chosen


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def build_plugin_manager(
    config: Mapping[str, Any],
    context: PluginContext,
    extra_plugins: Iterable[object] = (),
) -> tuple[pluggy.PluginManager, list[object]]:
    """Instantiate and register every plugin ``config`` names, plus the defaults.

    Plugins are registered in reverse so that, pluggy calling the last registered first, the
    plugin listed first in the config answers first. ``extra_plugins`` (tests, embedding
    programs) are registered last and so answer before everything else.

    :return: the manager and the plugin instances (to ``close()`` later).
    """
    pm = new_plugin_manager()
    context._plugin_manager = pm  # context.credential_env asks this manager's plugins
    instances: list[tuple[str, object]] = []
    for key, name in configured_plugins(config):
        cls = load_class(CONFIG_GROUPS[key], name)
        section = (config.get(key) or {}).get(name)
        if section is None:
            section = fill_defaults_for(cls)
        instance = cls(section, context)
        if hasattr(instance, "name") and not getattr(instance, "name", ""):
            instance.name = name
        instances.append((f"{key}:{name}", instance))
    for plugin_name, instance in reversed(instances):
        pm.register(instance, name=plugin_name)
    for index, plugin in enumerate(extra_plugins):
        pm.register(plugin, name=f"extra:{index}:{type(plugin).__name__}")
    pm.check_pending()
    logger.debug("plugins registered: {}", [n for n, _ in instances])
    return pm, [i for _, i in instances]


def fill_defaults_for(cls: type) -> dict[str, Any]:
    """The section a plugin gets when the config does not mention it: its schema defaults."""
    from gridgate.core.config import apply_defaults

    section: dict[str, Any] = {}
    apply_defaults(section, getattr(cls, "config_schema", {}))
    return section


def cli_plugin_manager(
    on_error: Callable[[PluginLoadError], None] | None = None,
) -> pluggy.PluginManager:
    """A manager holding every ``gridgate.cli`` provider: commands exist before config does.

    A provider that fails to import is reported through ``on_error`` and left out, so one
    broken plugin does not take the whole command line down with it.
    """
    from stevedore import ExtensionManager

    pm = new_plugin_manager()

    def failed(_manager: Any, ep: Any, err: BaseException) -> None:
        error = PluginLoadError(CLI_GROUP, ep.name, f"import failed: {type(err).__name__}: {err}")
        if on_error:
            on_error(error)

    manager = _fresh(ExtensionManager)(
        namespace=CLI_GROUP, invoke_on_load=False, on_load_failure_callback=failed
    )
    for ext in sorted(manager.extensions, key=lambda e: e.name):
        target = ext.plugin
        pm.register(target() if isinstance(target, type) else target, name=f"cli:{ext.name}")
    pm.check_pending()
    return pm
