"""The admin commands a daemon serves: ``status``, ``enable``/``disable``, ``block``/``unblock``/
``blocklist``, ``diagnose``, ``heartbeat`` and ``reconfig`` (docs/protocol.md, "Admin operations").

The daemon has checked who asks (root, the admins, its own user over its Unix socket) before a
request gets here. Each verb answers with the fields of its reply, or raises
:class:`ProtocolError`; the output follows the seed's ``badmin lsfproxyd`` (cli/render.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from loguru import logger

from gridgate.core.clock import Clock
from gridgate.core.config import ConfigError
from gridgate.core.documents import DocumentError
from gridgate.plugins.lsf_proxy.daemon import holding
from gridgate.plugins.lsf_proxy.daemon.adaptive import AdaptiveLimits
from gridgate.plugins.lsf_proxy.daemon.bypass import BypassWatch
from gridgate.plugins.lsf_proxy.daemon.diagnose import DiagnosticLog, diagnose_args, log_field
from gridgate.plugins.lsf_proxy.daemon.documents import diagnose_class, enable_category
from gridgate.plugins.lsf_proxy.daemon.guard import ConnectionGuard
from gridgate.plugins.lsf_proxy.daemon.peers import Heartbeat
from gridgate.plugins.lsf_proxy.daemon.policy import BlockRule
from gridgate.plugins.lsf_proxy.daemon.ratelimit import RateLimitedPolicy
from gridgate.plugins.lsf_proxy.daemon.reload_guard import ReloadLog
from gridgate.plugins.lsf_proxy.daemon.startup import StartupError
from gridgate.plugins.lsf_proxy.daemon.tokens import TokenDesk
from gridgate.plugins.lsf_proxy.wire import ProtocolError

Verb = Callable[[str, Mapping[str, Any], str, str], dict[str, Any]]


class Served(Protocol):
    """What the verbs need of the daemon they serve (:class:`~.daemon.ProxyDaemon`)."""

    name: str
    pid: int
    local_host: str
    clock: Clock
    policy: RateLimitedPolicy
    peers: Heartbeat
    diagnostics: DiagnosticLog
    reloads: ReloadLog
    guard: ConnectionGuard
    metrics_port: int | None
    tokens: TokenDesk
    bypass: BypassWatch | None
    adaptive: AdaptiveLimits | None

    @property
    def connections(self) -> int: ...

    def poke(self) -> None: ...

    def save_blocklist(self) -> None: ...

    def reload(self) -> dict[str, Any]: ...


class AdminVerbs:
    """The admin operations of one daemon: :meth:`serve` answers one of ``protocol.ADMIN_OPS``
    (a test checks that :attr:`verbs` holds them all)."""

    def __init__(self, daemon: Served) -> None:
        self.daemon = daemon
        self.verbs: dict[str, Verb] = {
            "status": self.status,
            "enable": self.enable,
            "disable": self.enable,
            "block": self.block,
            "unblock": self.block,
            "blocklist": self.blocklist,
            "diagnose": self.diagnose,
            "heartbeat": self.heartbeat,
            "reconfig": self.reconfig,
        }

    def serve(self, op: str, message: Mapping[str, Any], user: str, host: str) -> dict[str, Any]:
        """The reply fields of admin command ``op`` asked by ``user``@``host``.

        :raises ProtocolError: the request is wrong, or the command failed (``io_error``,
            ``bad_config``).
        """
        verb = self.verbs.get(op)
        if verb is None:  # pragma: no cover - the daemon passes only ADMIN_OPS
            raise ProtocolError("unknown_op", f"unknown op {op!r}")
        return verb(op, message, user, host)

    def service(self) -> dict[str, bool]:
        """Whether each category is enabled."""
        return {name: cat.enabled for name, cat in self.daemon.policy.categories.items()}

    def status(self, op: str, message: Mapping[str, Any], user: str, host: str) -> dict[str, Any]:
        d = self.daemon
        # peers first: a peer that fell silent since the last heartbeat is dropped now,
        # so the shares shown are the ones in force
        peers = d.peers.status() if d.peers.active else None
        status = d.policy.status()
        status.update(
            name=d.name,
            pid=d.pid,
            host=d.local_host,
            diagnose=d.diagnostics.on,
            diagnose_file=str(d.diagnostics.path),
            connections=d.connections,
            metrics_port=d.metrics_port,
            longest_held=holding.longest_held(d.policy),
            reloads=d.reloads.as_json(),
            capacity=d.guard.as_json(),
        )
        if peers is not None:
            status["peers"] = peers
        if d.bypass is not None:
            status["bypass"] = d.bypass.status()
        if d.adaptive is not None:
            status["adaptive"] = d.adaptive.status()
        return {"status": status}

    def enable(self, op: str, message: Mapping[str, Any], user: str, host: str) -> dict[str, Any]:
        """``enable`` and ``disable``: a disabled category's requests proceed without a token."""
        try:
            category = enable_category(message)
        except DocumentError as exc:
            raise ProtocolError("bad_request", exc.problem) from None
        for decision in self.daemon.policy.set_enabled(category, op == "enable"):
            self.daemon.tokens.deliver(decision)
        if self.daemon.bypass is not None:  # commands ran without tokens: not judged
            self.daemon.bypass.audit.disturb()
        self.daemon.peers.service_changed(self.service())
        logger.info("{} {} by {}@{}", op, category, user, host)
        return {"service": self.service()}

    def block(self, op: str, message: Mapping[str, Any], user: str, host: str) -> dict[str, Any]:
        """``block`` and ``unblock``: each named element is a rule of its own."""
        policy = self.daemon.policy
        rule = rule_from(message)
        if op == "block":
            added, decisions = policy.block(rule)
            for decision in decisions:
                self.daemon.tokens.deliver(decision)
            changed = added
        else:
            changed = policy.unblock(rule)
        if changed:
            self.daemon.save_blocklist()
        logger.info(
            "{} {} by {}@{} ({})",
            op,
            rule.describe(),
            user,
            host,
            "done" if changed else "no change",
        )
        done, kept = rule.partition(changed)
        return {
            "rule": rule.to_json(),
            "text": rule.describe(),
            "changed": bool(changed),
            "done": done.describe() if done else "",
            "kept": kept.describe() if kept else "",
        }

    def blocklist(
        self, op: str, message: Mapping[str, Any], user: str, host: str
    ) -> dict[str, Any]:
        blocklist = self.daemon.policy.blocklist
        return {"blocklist": blocklist.summary(), "rules": [r.to_json() for r in blocklist.rules]}

    def diagnose(self, op: str, message: Mapping[str, Any], user: str, host: str) -> dict[str, Any]:
        """``diagnose on|off [-t MINUTES] [-f FILE] [-c requests|bypass]``."""
        d = self.daemon
        log = d.diagnostics
        on, minutes, path = diagnose_args(message, log.folder)
        try:
            traced = diagnose_class(message)
        except DocumentError as exc:
            raise ProtocolError("bad_request", exc.problem) from None
        if traced == "bypass":
            return self._diagnose_bypass(on, minutes, path, user, host)
        try:
            log.diagnose(on, minutes, path, d.clock.monotonic())
        except OSError as exc:
            raise ProtocolError("io_error", f"cannot open {path or log.path}: {exc}") from None
        d.poke()  # the daemon's timer learns when a diagnosis for a while ends
        until = d.clock.time() + minutes * 60 if minutes else None
        logger.info(
            "diagnose {} by {}@{} ({}{})",
            "on" if on else "off",
            user,
            host,
            log.path,
            f", for {minutes:g} min" if minutes else "",
        )
        return {"diagnose": on, "file": str(log.path), "until": until}

    def _diagnose_bypass(
        self, on: bool, minutes: float | None, path: Any, user: str, host: str
    ) -> dict[str, Any]:
        """``diagnose on|off -c bypass``: the controller's log of every request for a while,
        each written to the diagnostic log with whether its user held a token."""
        d = self.daemon
        if d.bypass is None:
            raise ProtocolError(
                "bad_request",
                "diagnose -c bypass reads the scheduler: set proxyd.bypass.scheduler "
                "(docs/proxyd.md, 'Who went around the gate')",
            )
        trace = d.bypass.trace
        if not on:
            trace.stop()
            logger.info("diagnose off -c bypass by {}@{}", user, host)
            return {"diagnose": False, "class": "bypass", "file": str(d.diagnostics.path)}
        try:
            until = trace.start(minutes)
        except ValueError as exc:
            raise ProtocolError("bad_request", str(exc)) from None
        if not d.diagnostics.on or path is not None:  # the lines need the log, for as long
            try:
                left = (until - d.clock.time()) / 60
                d.diagnostics.diagnose(True, left, path, d.clock.monotonic())
            except OSError as exc:
                trace.stop()
                raise ProtocolError(
                    "io_error", f"cannot open {path or d.diagnostics.path}: {exc}"
                ) from None
            d.poke()
        logger.info(
            "diagnose on -c bypass by {}@{} until {} ({})",
            user,
            host,
            time.strftime("%H:%M:%S", time.localtime(until)),
            d.diagnostics.path,
        )
        return {
            "diagnose": True,
            "class": "bypass",
            "file": str(d.diagnostics.path),
            "until": until,
        }

    def heartbeat(
        self, op: str, message: Mapping[str, Any], user: str, host: str
    ) -> dict[str, Any]:
        """Another daemon of ``proxyd.hosts`` says it is alive (peers.py)."""
        try:
            return self.daemon.peers.answer(message)
        except ValueError as exc:
            raise ProtocolError("bad_request", str(exc)) from None

    def reconfig(self, op: str, message: Mapping[str, Any], user: str, host: str) -> dict[str, Any]:
        """Re-read the config file, as SIGHUP does."""
        try:
            return self.daemon.reload()
        except ConfigError as exc:
            raise ProtocolError(
                "bad_config", f"config refused, the old one stays:\n{exc}"
            ) from None
        except (StartupError, ValueError) as exc:
            raise ProtocolError("bad_config", str(exc)) from None


def rule_from(message: Mapping[str, Any]) -> BlockRule:
    """The block rule a ``block`` or ``unblock`` request names.

    :raises ProtocolError: ``bad_request``: not lists of names, or names no log may carry.
    """
    users, hosts = message.get("users") or [], message.get("hosts") or []
    if not (
        isinstance(users, list)
        and all(isinstance(u, str) for u in users)
        and isinstance(hosts, list)
        and all(isinstance(h, str) for h in hosts)
    ):
        raise ProtocolError("bad_request", "users and hosts must be lists of names")
    odd = [n for n in (*users, *hosts) if n and (len(n) > 128 or log_field(n) != n or "@" in n)]
    if odd:
        # they reach the daemon's log, the blocklist file and every admin's terminal
        raise ProtocolError(
            "bad_request",
            f"{len(odd)} name(s) outside letters, digits and "
            "'._-+:' (at most 128): not a user or host name",
        )
    try:
        return BlockRule.make(bool(message.get("all")), users, hosts)
    except ValueError as exc:
        raise ProtocolError("bad_request", str(exc)) from None
