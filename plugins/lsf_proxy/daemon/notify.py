"""The token daemon's own messages to people: the site config's ``notifiers:`` (the director's
mail, GGUS, files), loaded by the daemon from the file it serves, for what it must tell beyond
its log (a user who keeps going around the gate, ``proxyd.bypass.notify_after``).

The notifiers are built as the director builds them: each class from its entry point
(:func:`gridgate.core.plugins.load_class`), with its validated section, a context whose state
store is the config's (``state:``; e-mail de-duplication) and whose folder is the daemon's own
(beside its socket: an outbox there belongs to the daemon's user). A notification is handed to
every notifier in a thread (they may touch files and the state store); one that cannot be sent
waits in that notifier's outbox, as the director's do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pluggy
from loguru import logger

from gridgate.core import hookspecs
from gridgate.core.model import Notification
from gridgate.core.plugins import PluginContext, PluginLoadError, load_class
from gridgate.core.state import open_state
from gridgate.plugins.lsf_proxy.schedulers import PROJECT

#: The notifiers' entry-point group, as the site config's ``notifiers:`` section names them.
NOTIFIERS = "gridgate.notifiers"


class DaemonNotifiers:
    """The ``notifiers:`` of ``config`` (a loaded site config), for one daemon."""

    def __init__(self, config: Mapping[str, Any], folder: Path) -> None:
        self.names = sorted((config.get("notifiers") or {}).keys())
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.plugins: list[Any] = []
        if not self.names:
            return
        state = open_state(config)
        context = PluginContext(state=state, state_dir=folder, config=config)
        for name in self.names:
            try:
                cls = load_class(NOTIFIERS, name)
                plugin = cls(config["notifiers"][name] or {}, context)
            except (PluginLoadError, ValueError, OSError) as exc:
                logger.error("lsfproxyd: notifier {} not loaded: {}", name, exc)
                continue
            self.manager.register(plugin, name=f"notifier.{name}")
            self.plugins.append(plugin)

    def send(self, notification: Notification) -> None:
        """Hand ``notification`` to every notifier (blocking: run in a thread)."""
        if not self.plugins:
            logger.warning("lsfproxyd: no notifier configured for: {}", notification.subject)
            return
        try:
            self.manager.hook.gridgate_notify(notification=notification)
        except Exception as exc:  # a notifier's bug must not end the daemon's loops
            logger.error("lsfproxyd: notifying {!r} failed: {!r}", notification.subject, exc)

    async def notify(self, notification: Notification) -> None:
        await asyncio.to_thread(self.send, notification)

    def close(self) -> None:
        for plugin in self.plugins:
            try:
                plugin.close()
            except Exception as exc:  # noqa: BLE001 - closing the others matters more
                logger.warning("lsfproxyd: closing a notifier: {!r}", exc)
