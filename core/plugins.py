"""What a plugin is (:class:`Plugin`), the services it is given (:class:`PluginContext`), and
where plugins are found: the entry-point groups, and one class loaded by name (stevedore).

A configured name that is not installed or fails to import is a :class:`PluginLoadError`
naming the group, the name and the cause; never a silent skip. Building the plugin manager a
config asks for (the defaults registered last, answering last) is the engine's
(:mod:`gridgate.core.engine.loader`).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pluggy

from gridgate.core._moved import moved_names
from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.credential_names import in_force
from gridgate.core.failing import FailingCache
from gridgate.core.runner import DEFAULT_MAX_OUTPUT
from gridgate.core.settings import Settings, settings_from
from gridgate.core.state import STATE_GROUP, StateStore

__all__ = [
    "SCHEDULERS_GROUP",
    "ConfigPath",
    "ConfigProblems",
    "Plugin",
    "PluginContext",
    "PluginLoadError",
    "EXAMPLE_FILE",
    "load_class",
    "plugin_example",
    "section_settings",
]

#: The file a plugin may ship beside its module: a whole site config that uses it, commented,
#: that validates (``gridgate config example --backend NAME`` prints a backend's).
EXAMPLE_FILE = "example.yaml"

#: Where in a config a problem is: the keys (and list indexes) down from a section, or from the
#: file's root in :meth:`Plugin.document_errors`: ``("servers", 2)``.
ConfigPath = tuple[str | int, ...]
#: What a plugin's config checks return: (where, message) pairs; empty when all is well.
ConfigProblems = list[tuple[ConfigPath, str]]

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
SECTIONS_GROUP = "gridgate.sections"
CLI_GROUP = "gridgate.cli"
#: Schedulers' controllers as the token daemon reads them (``proxyd.bypass.scheduler``): the
#: ``gridgate_scheduler_rpcs`` and ``gridgate_scheduler_deny`` hooks.
SCHEDULERS_GROUP = "gridgate.schedulers"
ALL_GROUPS = (*CONFIG_GROUPS.values(), STATE_GROUP, SECTIONS_GROUP, CLI_GROUP, SCHEDULERS_GROUP)


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

    #: the manager holding the plugins built with this context (set by the loader that built
    #: them): :meth:`credential_env` asks its credential plugins
    plugin_manager: pluggy.PluginManager | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.failing is None and self.state is not None:
            director = self.config.get("director") or {}
            self.failing = FailingCache.from_config(self.state, self.clock, director)

    def credential_env(self, kind: str, name: str = "") -> dict[str, str]:
        """The environment variables that hand the credential of ``kind`` (``x509``) to a
        command: ``{"X509_USER_PROXY": "/var/lib/gridgate/proxy.pem"}``. Merge them into the
        command's environment (``env={**os.environ, **context.credential_env("x509")}``).

        Answered by the configured credential plugin of that kind from its section, so it works
        in any process that built the plugins from the config, iteration or not. ``{}`` when no
        credential plugin of that kind is configured: the command then runs with whatever its
        environment has, unmanaged.

        Within a submission, list-match, poll or cancel the director made, the credential of
        that kind that the call's demand group, endpoint or backend names
        (:func:`gridgate.core.credential_names.credentials_in_force`); else the first
        configured of that kind.

        :param kind: a kind the backend lists in ``BackendInfo.credentials``.
        :param name: the credential's name in ``credentials:`` ('' : as said above).
        """
        if self.plugin_manager is None:
            return {}
        name = name or in_force().get(kind, "")
        plugin = self.plugin_manager.get_plugin(f"credentials:{name}") if name else None
        if plugin is not None and hasattr(plugin, "gridgate_credential_env"):
            answer = plugin.gridgate_credential_env(kind=kind)
        else:
            answer = self.plugin_manager.hook.gridgate_credential_env(kind=kind)
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
    ``settings_class`` (a :class:`gridgate.core.settings.Settings` dataclass, one field per
    property of ``config_schema``) is how the plugin reads it: the constructor builds
    ``self.settings`` from the section once, typed, defaults from the schema alone, and the
    class's cross-key rules are config errors (``config_errors``). ``self.config`` keeps the
    section as written for plugins that read it themselves (API 1.x). ``config_errors`` adds
    cross-field checks a schema cannot express.
    """

    config_schema: ClassVar[dict[str, Any]] = {"type": "object", "additionalProperties": False}
    settings_class: ClassVar[type[Settings] | None] = None
    #: the section's typed settings (None for a plugin that declares no ``settings_class``)
    settings: Any = None
    name: str = ""
    #: A backend: the key of its section that lists its endpoints (``servers``); a configured
    #: backend whose list is empty is a config error, since it could submit nowhere.
    endpoints_key: ClassVar[str | None] = None

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        self.config = config
        self.context = context
        if self.settings_class is not None:
            self.settings = settings_from(
                self.config_schema, config, self.settings_class, validate=False
            )

    @classmethod
    def endpoint_names(cls, section: Mapping[str, Any]) -> list[str]:
        """The names of the endpoints ``section`` configures, as ``weights`` and the commands
        name them (API 1.9): by default each item of ``endpoints_key`` as written; a backend
        whose items are not names (ARC's URLs) gives the names it derives."""
        return listed_endpoints(cls, section)

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> ConfigProblems:
        """Cross-field problems as (path inside the section, message); empty when fine. The
        default reports the ``settings_class``'s rules (:meth:`Settings.problems`): a
        subclass that adds checks of its own extends ``super().config_errors(section)``."""
        if cls.settings_class is None:
            return []
        settings = settings_from(cls.config_schema, section, cls.settings_class, validate=False)
        return list(settings.problems())

    @classmethod
    def config_warnings(cls, section: Mapping[str, Any]) -> ConfigProblems:
        """Legal settings that are probably not meant, as (path, message); `gridgate config
        validate` prints them and still says valid."""
        return []

    @classmethod
    def document_errors(
        cls, document: Mapping[str, Any], classes: Mapping[tuple[str, str], type]
    ) -> ConfigProblems:
        """Problems that need more of the file than the plugin's own section (a threshold that
        must stay below another section's), as (path from the file's root, message); empty
        when fine. Called once per load, after every section passed its own checks, with the
        whole document as written (relative paths resolved, defaults not filled) and the
        plugin classes it names by (config key, name)."""
        return []

    def close(self) -> None:
        """Release threads, sockets, files. Called when the config is replaced or at exit."""


def entry_point_names(group: str) -> list[str]:
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
        raise PluginLoadError(group, name, "not installed", entry_point_names(group))
    return manager.extensions[0].plugin


def listed_endpoints(cls: Any, section: Mapping[str, Any]) -> list[str]:
    """The items of ``cls.endpoints_key`` in ``section`` as written: the endpoint names of a
    backend class that derives none (:meth:`Plugin.endpoint_names`' default)."""
    items = section.get(getattr(cls, "endpoints_key", None) or "") or []  # not config: raw
    return [str(e) for e in items if isinstance(e, (str, int))]


def plugin_example(group: str, name: str) -> str | None:
    """The example site config the plugin ``name`` of entry-point ``group`` ships
    (:data:`EXAMPLE_FILE` in the package of its class's module); None when it ships none.

    :raises PluginLoadError: not installed, or its import failed.
    """
    from importlib.resources import files

    cls = load_class(group, name)
    package = cls.__module__.rpartition(".")[0] or cls.__module__
    try:
        return files(package).joinpath(EXAMPLE_FILE).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError, ModuleNotFoundError):
        return None


#: the plugin loader of API 1.4 is the engine's now, gridgate.core.engine.loader
__getattr__ = moved_names(__name__)


def section_settings(config: Mapping[str, Any], key: str) -> Any:
    """The typed settings of the top-level section ``key`` (``director``) of a whole config
    (``context.config``), as the ``gridgate.sections`` plugin that owns it declares them
    (its ``settings_class``), defaults from its schema: how a plugin reads another section
    than its own without writing its defaults again.

    :param config: the whole validated config.
    :param key: the section's key, the name of its ``gridgate.sections`` entry point.
    :raises PluginLoadError: no section plugin of that name is installed, or it declares no
        settings class.
    """
    cls: Any = load_class(SECTIONS_GROUP, key)
    settings_class = getattr(cls, "settings_class", None)
    if settings_class is None:
        raise PluginLoadError(SECTIONS_GROUP, key, "declares no settings_class")
    return settings_from(cls.config_schema, config.get(key) or {}, settings_class, validate=False)
