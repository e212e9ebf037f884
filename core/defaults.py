"""The built-in default plugins: random endpoint choice, rule-based classification, log
notification and admit-all admission. They are registered like any other plugin and answer
last (``trylast``), so a configured plugin always speaks first."""

from __future__ import annotations

import math
import os
import random
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.files import atomic_write, resolve_dir
from gridgate.core.kinds import KINDS, missing_input
from gridgate.core.model import (
    AdmissionRequest,
    Availability,
    CommandResult,
    Endpoint,
    Failure,
    Grant,
    Notification,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.state import StateError
from gridgate.core.weights import (
    DEFAULT_THROUGHPUT_FLOOR,
    DEFAULT_THROUGHPUT_WINDOW,
    THROUGHPUT_SCHEMA,
    SmoothWeightedRoundRobin,
    effective_weights,
    read_throughput,
    throughput_weights,
    weighted_choice,
)


def _uniform(weights: Sequence[int]) -> bool:
    """Whether every candidate weighs the same (the selectors then choose as they always did,
    so a seeded run's sequence is the one it was before weights existed)."""
    return len(set(weights)) <= 1


#: the random selectors' ``seed`` option
_SEED: dict[str, Any] = {
    "type": ["integer", "null"],
    "default": None,
    "description": "Fix the random sequence (tests, reproducible demos).",
}


def _rng(config: Mapping[str, Any]) -> random.Random:
    """The sequence ``seed`` fixes, else the system's."""
    seed = config.get("seed")
    return random.Random(seed) if seed is not None else random.SystemRandom()


class RandomSelector(Plugin):
    """Pick the endpoint at random, as the seed's director did: uniformly, or in proportion to
    the backend's ``weights`` times the availability factor (a degraded endpoint counts half),
    given by the hook's ``weights`` and ``availability`` arguments."""

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "seed": _SEED,
        },
        "additionalProperties": False,
    }

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._random = _rng(config)

    @hookimpl(trylast=True)
    def gridgate_select_endpoint(
        self,
        candidates: Sequence[Endpoint],
        request: SubmitRequest,
        weights: Mapping[str, int],
        availability: Mapping[str, Availability],
    ) -> Endpoint | None:
        if not candidates:
            return None
        shares = effective_weights(candidates, weights, availability)
        if _uniform(shares):
            return self._random.choice(list(candidates))
        return weighted_choice(list(candidates), shares, self._random)


class RoundRobinSelector(Plugin):
    """Take the usable endpoints in turn: every server gets its share in the same order each
    time, for sites that prefer an even spread to a random one (and for reproducible runs).
    With ``weights`` (or a degraded endpoint, which counts half) the turns follow nginx's smooth
    weighted round robin: weights 3, 1 give a a b a, spread out."""

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._next = 0
        self._lock = threading.Lock()
        self._weighted = SmoothWeightedRoundRobin()

    @hookimpl
    def gridgate_select_endpoint(
        self,
        candidates: Sequence[Endpoint],
        request: SubmitRequest,
        weights: Mapping[str, int],
        availability: Mapping[str, Availability],
    ) -> Endpoint | None:
        if not candidates:
            return None
        shares = effective_weights(candidates, weights, availability)
        if not _uniform(shares):
            return self._weighted.choose(list(candidates), shares)
        with self._lock:
            turn = self._next
            self._next += 1
        return list(candidates)[turn % len(candidates)]


class ThroughputSelector(Plugin):
    """Pick the endpoint at random in proportion to its recent throughput (done pilots per
    hour over ``window``, at least ``floor``) times its configured weight and availability:
    servers that finish pilots get more of them. The rates are read from the pilot registry at
    most once a minute (one read per endpoint); while it cannot be read every endpoint counts
    as ``floor``, so the choice falls back to the weights alone."""

    config_schema: ClassVar[dict[str, Any]] = {
        **THROUGHPUT_SCHEMA,
        "properties": {
            **THROUGHPUT_SCHEMA["properties"],
            "seed": _SEED,
        },
    }
    #: seconds the rates read from the registry are used before they are read again
    REFRESH: ClassVar[float] = 60.0

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._random = _rng(config)
        self.window = float(config.get("window", DEFAULT_THROUGHPUT_WINDOW))
        self.floor = float(config.get("floor", DEFAULT_THROUGHPUT_FLOOR))
        self.max_pilots = int(config.get("max_pilots", 100000))
        self._rates: dict[Endpoint, float] = {}
        self._read_at: dict[Endpoint, float] = {}
        self._lock = threading.Lock()
        self._failing = False

    def rates(self, candidates: Sequence[Endpoint]) -> dict[Endpoint, float]:
        """Each candidate's done pilots per hour (at least ``floor``), read again when older
        than :attr:`REFRESH` seconds."""
        now = self.context.clock.time()
        with self._lock:
            stale = [e for e in candidates if now - self._read_at.get(e, -math.inf) >= self.REFRESH]
            if stale and self.context.state is not None:
                try:
                    registry = self.context.state.pilot_registry()
                    read = read_throughput(registry, stale, now, self.window, self.max_pilots)
                except StateError as exc:
                    if not self._failing:
                        logger.error(
                            "throughput selector: cannot read the pilot registry ({}); "
                            "choosing by the weights alone",
                            exc,
                        )
                    self._failing = True
                else:
                    self._failing = False
                    self._rates.update(read)
                    self._read_at.update(dict.fromkeys(read, now))
            known = {e: self._rates.get(e, 0.0) for e in candidates}
        return throughput_weights(known, self.floor)

    @hookimpl
    def gridgate_select_endpoint(
        self,
        candidates: Sequence[Endpoint],
        request: SubmitRequest,
        weights: Mapping[str, int],
        availability: Mapping[str, Availability],
    ) -> Endpoint | None:
        if not candidates:
            return None
        items = list(candidates)
        shares = effective_weights(items, weights, availability)
        rates = self.rates(items)
        return weighted_choice(
            items, [w * rates[e] for e, w in zip(items, shares, strict=True)], self._random
        )


RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "kind": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
        "pattern": {"type": "string", "description": "Regular expression searched in the output."},
        "stream": {"enum": ["stdout", "stderr", "any"], "default": "any"},
        "returncode": {"type": "integer"},
        "backend": {"type": "string", "description": "Only for this backend (default: all)."},
        "exclude": {"type": "boolean", "default": True},
        "notify": {"type": "boolean", "default": True},
        "transient": {"type": "boolean", "default": True},
    },
    "required": ["kind"],
    "additionalProperties": False,
}


def compile_rules(
    rules: Sequence[Mapping[str, Any]],
) -> list[tuple[re.Pattern[str] | None, Mapping[str, Any]]]:
    return [
        (re.compile(r["pattern"], re.MULTILINE) if r.get("pattern") else None, r) for r in rules
    ]


def match_rules(
    compiled: Sequence[tuple[re.Pattern[str] | None, Mapping[str, Any]]], result: SubmitResult
) -> Failure | None:
    """The first site rule that matches ``result``'s command evidence, as a Failure."""
    command = result.command
    for pattern, rule in compiled:
        if rule.get("backend") and rule["backend"] != result.endpoint.backend:
            continue
        if "returncode" in rule and (command is None or command.returncode != rule["returncode"]):
            continue
        if pattern is not None:
            stream = rule.get("stream", "any")
            texts = []
            if command is not None:
                if stream in ("stdout", "any"):
                    texts.append(command.stdout)
                if stream in ("stderr", "any"):
                    texts.append(command.stderr)
            found = next((m for t in texts if (m := pattern.search(t))), None)
            if found is None:
                continue
            reason = found.group(0).strip()[:200]
        else:
            reason = f"matched site rule {rule['kind']!r}"
        return Failure(
            kind=rule["kind"],
            exclude=rule.get("exclude", True),
            notify=rule.get("notify", True),
            transient=rule.get("transient", True),
            reason=reason,
        )
    return None


def local_io_failure(reason: str) -> Failure:
    """The ``local_io`` failure of a command that could not be prepared on this machine (its
    files could not be written: ``SubmitResult.local_fault``); ``reason`` says what failed. No
    server is blamed: the backend is paused for the rest of the iteration."""
    return KINDS["local_io"].failure(reason)


def missing_input_in(command: CommandResult) -> str:
    """Why a failed ``command`` failed for want of an input file of this machine, or ``""``.

    The evidence: an absolute path in its argv (whole, or after ``--option=``) that its output
    names, and that is not a file this process can read (``kinds.missing_input``). So
    ``qsub /srv/pilot.sh`` printing ``error opening /srv/pilot.sh: No such file or directory``
    is the pilot's missing script, not a failing server, whichever batch system printed it; a
    path merely in the argv (an output file yet to be written) is not."""
    if command.launch_error is not None or command.timed_out or command.returncode == 0:
        return ""
    output = f"{command.stdout}\n{command.stderr}"
    for item in command.argv[1:]:
        path = item.split("=", 1)[1] if item.startswith("-") and "=" in item else item
        if not path.startswith("/") or path not in output:
            continue
        why = missing_input({"the input file": path})
        if why:
            said = next(line.strip() for line in output.splitlines() if path in line)
            return f"{why}; {command.argv[0]} said: {said[:200]}"
    return ""


def generic_failure(result: SubmitResult) -> Failure:
    """What any failed command is when nothing more specific is known."""
    command = result.command
    if result.local_fault:
        return local_io_failure(result.local_fault)
    if command is None:
        return KINDS["error"].failure(result.message or "backend gave no command evidence")
    if command.launch_error is not None:
        return KINDS["launch"].failure(command.launch_error)
    if command.timed_out:
        return KINDS["timeout"].failure(command.describe())
    missing = missing_input_in(command)
    if missing:
        return KINDS["missing_input"].failure(missing)
    if command.returncode == 0:
        return KINDS["bad_output"].failure(result.message or "exit code 0 but no usable answer")
    last = next(
        (
            line.strip()
            for line in reversed((command.stderr or command.stdout).splitlines())
            if line.strip()
        ),
        "",
    )
    return KINDS["error"].failure(f"{command.describe()}: {last}"[:300])


class RuleClassifier(Plugin):
    """Site rules from config, then the generic kinds (launch, timeout, bad_output, error).

    Answers last: a backend that knows its tool's messages classifies first; this catches
    everything else so that every failure gets a kind.
    """

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "rules": {
                "type": "array",
                "items": RULE_SCHEMA,
                "default": [],
                "description": "Checked in order; the first match gives the kind.",
            },
        },
        "additionalProperties": False,
    }

    @classmethod
    def config_errors(cls, section: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for index, rule in enumerate(section.get("rules", [])):
            try:
                re.compile(rule.get("pattern", ""))
            except re.error as exc:
                problems.append((("rules", index, "pattern"), f"invalid regular expression: {exc}"))
        return problems

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        self._rules = compile_rules(config.get("rules", []))

    @hookimpl(trylast=True)
    def gridgate_classify_failure(self, endpoint: Endpoint, result: SubmitResult) -> Failure:
        return match_rules(self._rules, result) or generic_failure(result)


class LogNotifier(Plugin):
    """Write every notification to the log: the notifier that needs no server."""

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "body": {
                "type": "boolean",
                "default": False,
                "description": "Log the whole body, not just the subject.",
            },
        },
        "additionalProperties": False,
    }

    _LEVELS: ClassVar[dict[str, str]] = {"info": "INFO", "error": "ERROR", "alarm": "CRITICAL"}

    @hookimpl(trylast=True)
    def gridgate_notify(self, notification: Notification) -> None:
        level = self._LEVELS.get(notification.level, "WARNING")
        if self.config.get("body"):
            logger.log(
                level, "[{}] {}\n{}", notification.level, notification.subject, notification.body
            )
        else:
            logger.log(level, "[{}] {}", notification.level, notification.subject)


class AdmitAll(Plugin):
    """Admission control that admits everything: the default when none is configured."""

    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }

    @hookimpl(trylast=True)
    def gridgate_admit(self, request: AdmissionRequest) -> Grant:
        return Grant(issuer="all", category=request.category)

    @hookimpl(trylast=True)
    def gridgate_release(self, grant: Grant) -> None:
        """Nothing was taken, so nothing is given back."""


class FileNotifier(Plugin):
    """Write each notification as a text file in a folder: for sites whose mail goes through
    another system that picks files up, and for the demo, which has no mail server."""

    config_schema: ClassVar[dict[str, Any]] = {
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

    def __init__(self, config: Mapping[str, Any], context: PluginContext) -> None:
        super().__init__(config, context)
        # under the state folder by default, beside the outboxes, wherever that was put
        self.folder = resolve_dir(
            str(config.get("folder") or ""), context.state_dir, "notifications"
        )
        self._lock = threading.Lock()
        self._sequence = 0

    @hookimpl
    def gridgate_notify(self, notification: Notification) -> None:
        if notification.level not in self.config.get("levels", ["error", "alarm"]):
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
