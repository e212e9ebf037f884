"""Builds the plugin manager a config asks for: every plugin the config names (found through
its entry point, :func:`gridgate.core.plugins.load_class`), instantiated with its validated
section, and the built-in defaults, registered so that they answer last; and the manager of
the command-line providers.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy
from loguru import logger

from gridgate.core import PROJECT, hookspecs
from gridgate.core.config import apply_defaults
from gridgate.core.credential_names import credential_kind
from gridgate.core.credentials import CredentialPlugin
from gridgate.core.plugins import (
    ALL_GROUPS,
    CLI_GROUP,
    CONFIG_GROUPS,
    PluginContext,
    PluginLoadError,
    entry_point_names,
    load_class,
)

#: Built-in defaults, always registered; a config section of the same name configures them.
DEFAULT_PLUGINS: tuple[tuple[str, str], ...] = (
    ("selectors", "random"),
    ("classifiers", "rules"),
    ("escalation", "caches"),
    ("notifiers", "log"),
    ("admission", "all"),
    ("availability", "operator"),
)


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
    context.plugin_manager = pm  # context.credential_env asks this manager's plugins
    instances: list[tuple[str, object]] = []
    for key, name in configured_plugins(config):
        section = (config.get(key) or {}).get(name)
        # a named credential's plugin is its kind (``atlas-token: {kind: bearer_token}``)
        kind = credential_kind(name, section) if key == "credentials" else name
        cls = load_class(CONFIG_GROUPS[key], kind)
        if section is None:
            section = fill_defaults_for(cls)
        instance: object
        if key == "credentials" and issubclass(cls, CredentialPlugin):
            instance = cls(section, context, name=name)  # its files may be named after it
        else:
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
    pm = new_plugin_manager()
    for name in entry_point_names(CLI_GROUP):
        try:
            target: Any = load_class(CLI_GROUP, name)
        except PluginLoadError as error:
            if on_error:
                on_error(error)
            continue
        pm.register(target() if isinstance(target, type) else target, name=f"cli:{name}")
    pm.check_pending()
    return pm
