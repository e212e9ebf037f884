"""The built-in notifiers: ``log`` (every notification to the log, the default) and ``files``
(each notification as a text file in a folder something else picks up)."""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.files import atomic_write, resolve_dir
from gridgate.core.model import (
    Notification,
)
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.settings import Settings

LOG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "body": {
            "type": "boolean",
            "default": False,
            "description": "Log the whole body, not just the subject (then also of the "
            "notifications whose event the director logged in its own line).",
        },
    },
    "additionalProperties": False,
}

FILES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "folder": {
            "type": "string",
            "x-gridgate-path": True,
            "default": "",
            "description": "Where the texts are written (created, mode 0700; "
            '"": <director.state_dir>/notifications).',
        },
        "levels": {
            "type": "array",
            "items": {"enum": ["info", "error", "alarm"]},
            "default": ["error", "alarm"],
            "description": "Levels written.",
        },
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class LogSettings(Settings):
    """The ``log`` notifier's section."""

    section_schema: ClassVar[dict[str, Any]] = LOG_SCHEMA

    body: bool


@dataclass(frozen=True)
class FilesSettings(Settings):
    """The ``files`` notifier's section."""

    section_schema: ClassVar[dict[str, Any]] = FILES_SCHEMA

    folder: str
    levels: frozenset[str]


class LogNotifier(Plugin):
    """Write every notification to the log: the notifier that needs no server.

    One event, one line: a notification whose sender already logged the event
    (:attr:`Notification.logged`, a credential renewed, a source answering again) is not
    written again unless ``body`` asks for the bodies, which the log does not hold yet."""

    config_schema: ClassVar[dict[str, Any]] = LOG_SCHEMA
    settings_class = LogSettings
    settings: LogSettings

    _LEVELS: ClassVar[dict[str, str]] = {"info": "INFO", "error": "ERROR", "alarm": "CRITICAL"}

    @hookimpl(trylast=True)
    def gridgate_notify(self, notification: Notification) -> None:
        if notification.logged and not self.settings.body:
            return
        level = self._LEVELS.get(notification.level, "WARNING")
        if self.settings.body:
            logger.log(
                level, "[{}] {}\n{}", notification.level, notification.subject, notification.body
            )
        else:
            logger.log(level, "[{}] {}", notification.level, notification.subject)


class FileNotifier(Plugin):
    """Write each notification as a text file in a folder: for sites whose mail goes through
    another system that picks files up, and for the demo, which has no mail server."""

    config_schema: ClassVar[dict[str, Any]] = FILES_SCHEMA
    settings_class = FilesSettings
    settings: FilesSettings

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        # under the state folder by default, beside the outboxes, wherever that was put
        self.folder = resolve_dir(self.settings.folder, context.state_dir, "notifications")
        self._lock = threading.Lock()
        self._sequence = 0
        #: the last files written (``gridgate notify test`` names them)
        self.written: deque[Path] = deque(maxlen=16)

    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        if notification.level not in self.settings.levels:
            return
        with self._lock:
            self._sequence += 1
            sequence = self._sequence
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(notification.created))
        who = re.sub(
            r"[^A-Za-z0-9_.-]",
            "_",
            notification.endpoint.name if notification.endpoint else "gridgate",
        )
        path = self.folder / f"{stamp}-{os.getpid()}-{sequence:05d}-{notification.level}-{who}.txt"
        text = (
            f"Subject: {notification.subject}\nLevel: {notification.level}\n\n{notification.body}"
        )
        # Whole or not at all: whatever picks the texts up never sees half a message, and a
        # write the disk refuses leaves nothing behind.
        atomic_write(path, text.encode("utf-8"))
        self.written.append(path)
