"""The director behind tokens: ``gridgate_admit``/``gridgate_release`` from the token policy,
in-process per server (``mode: local``) or from the lsfproxyd daemon(s) (``mode: remote``).

``local`` runs one :class:`TokenPolicy` per endpoint, created on first use: at most ``max``
submissions in flight per WMS server, one grant per ``throttle`` ms above ``nominal``, and a
submission that waited ``token_wait_time`` is refused. The director usually runs as root, so in
this mode nobody is privileged: the point is to protect a server from the director itself.
``remote`` takes a ``submission`` token from the daemon per submission with the lsfproxyd client
(the top-level ``proxyd:`` section says where the daemons are) and gives it back on release.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from loguru import logger

from gridgate.core import hookimpl
from gridgate.core.clock import SYSTEM_CLOCK, Clock
from gridgate.core.model import AdmissionRequest, Grant, Refusal
from gridgate.core.plugins import Plugin, PluginContext
from gridgate.core.settings import Settings
from gridgate.plugins.lsf_proxy.client.client import ProxyClient
from gridgate.plugins.lsf_proxy.client.client import Token as ClientToken
from gridgate.plugins.lsf_proxy.client.settings import ClientSettings
from gridgate.plugins.lsf_proxy.config import (
    CATEGORIES,
    MAX_HOLD,
    MAX_THROTTLE_MS,
    MAX_WAIT,
    Limits,
    PolicyError,
    resolve_category,
)
from gridgate.plugins.lsf_proxy.daemon.policy import (
    DENIED,
    GRANTED,
    LocalTokens,
    PolicySettings,
    TokenPolicy,
)
from gridgate.plugins.lsf_proxy.wire import NoToken, ProxyUnavailable, RequestFailed

#: The key of the requests that name no endpoint (plain commands) in local mode.
NO_ENDPOINT = "-"


@dataclass(frozen=True)
class EndpointStats:
    """What admission did for one endpoint: grants, how many had to wait and how long,
    refusals, and the most tokens held at once."""

    granted: int = 0
    waited: int = 0
    wait_seconds: float = 0.0
    refused: int = 0
    max_in_use: int = 0


#: The keys each mode alone reads (the others' descriptions start with their mode).
MODE_KEYS: Mapping[str, tuple[str, ...]] = {
    "local": ("max", "nominal", "throttle", "token_wait_time", "queue_limit", "lease_time"),
    "remote": ("socket", "notoken_ntries", "user", "when_unavailable"),
}
ADMISSION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Admission by tokens: per-server limits in-process, or the lsfproxyd "
    "daemon(s) of the proxyd: section.",
    "properties": {
        "mode": {
            "enum": ["local", "remote"],
            "default": "local",
            "description": "local: one token policy per server in this process; "
            "remote: take tokens from the lsfproxyd daemon(s).",
        },
        "max": {
            "type": "integer",
            "minimum": 1,
            "default": 8,
            "description": "local: most commands in flight per server.",
        },
        "nominal": {
            "type": ["integer", "null"],
            "minimum": 1,
            "default": None,
            "description": "local: below this many in flight, grant at once; above, "
            "one grant per throttle (null: the seed's rule, = max "
            "when max < 50, else 50).",
        },
        "throttle": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_THROTTLE_MS,
            "default": 1,
            "description": "local: milliseconds between grants above nominal.",
        },
        "token_wait_time": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_WAIT,
            "default": 15,
            "description": "local: seconds a submission may wait for a token before it is refused.",
        },
        "queue_limit": {
            "type": "integer",
            "minimum": 1,
            "default": 1000,
            "description": "local: waiting submissions per server; more are refused at once.",
        },
        "lease_time": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": MAX_HOLD,
            "default": None,
            "description": "local: seconds after which a token never given back "
            "is taken back (null: 3 x director.command_timeout "
            "+ 60, at least 600).",
        },
        "categories": {
            "type": "array",
            "items": {"enum": list(CATEGORIES)},
            "default": ["submission"],
            "description": "Categories this plugin governs; others are left to "
            "the next admission plugin (the default admits).",
        },
        "socket": {
            "type": "string",
            "x-gridgate-path": True,
            "default": "",
            "description": "remote: the daemon's socket (default: "
            "$GRIDGATE_PROXYD_SOCKET, proxyd.socket or proxyd.hosts).",
        },
        "notoken_ntries": {
            "type": "integer",
            "minimum": 1,
            "default": 1,
            "description": "remote: attempts when the daemon denies a token; "
            "the director retries the pilot next iteration.",
        },
        "user": {
            "type": "string",
            "default": "",
            "description": "remote: user named in signed TCP requests (the director's "
            "service account); empty: the process's user. Over a Unix "
            "socket the kernel says who is asking.",
        },
        "when_unavailable": {
            "enum": ["proceed", "refuse"],
            "default": "proceed",
            "description": "remote: no daemon answers -> proceed without a "
            "token (with a warning, as LSF does) or refuse.",
        },
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class AdmissionSettings(Settings):
    """The ``lsf_proxy`` admission section, typed (defaults: :data:`ADMISSION_SCHEMA`)."""

    section_schema: ClassVar[Mapping[str, Any]] = ADMISSION_SCHEMA
    mode: str
    max: int
    nominal: int | None
    throttle: int
    token_wait_time: float
    queue_limit: int
    lease_time: float | None
    categories: frozenset[str]
    socket: str
    notoken_ntries: int
    user: str
    when_unavailable: str

    def limits(self) -> Limits:
        """local: the limits of every category (the seed's rule for a ``nominal`` not given).

        :raises PolicyError: ``nominal`` above ``max``.
        """
        given = {"max": self.max, "nominal": self.nominal, "throttle": self.throttle}
        return resolve_category({k: v for k, v in given.items() if v is not None})

    def cross_rules(self) -> list[tuple[tuple[str | int, ...], str]]:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        try:
            self.limits()
        except PolicyError as exc:
            problems.append((exc.path[-1:] or ("nominal",), str(exc)))
        # a key of the other mode would be accepted and then do nothing
        other = "remote" if self.mode == "local" else "local"
        for key in MODE_KEYS[other]:
            if getattr(self, key) != ADMISSION_SCHEMA["properties"][key]["default"]:
                problems.append(
                    ((key,), f"{key} is read in mode: {other} only, and mode is {self.mode}")
                )
        return problems


class ProxyAdmission(Plugin):
    """Admission control by token: ``local`` (per server, in-process) or ``remote`` (lsfproxyd)."""

    name = "lsf_proxy"

    config_schema: ClassVar[dict[str, Any]] = ADMISSION_SCHEMA
    settings_class = AdmissionSettings
    settings: AdmissionSettings

    @staticmethod
    def _lease_time(settings: AdmissionSettings, context: PluginContext) -> float:
        # The director always releases (in a finally) once list-match and submit are over,
        # each killed at command_timeout; the lease only bounds a token lost to a bug, and
        # lets the policy forget its lease records instead of keeping one per submission.
        if settings.lease_time:
            return settings.lease_time
        timeout = float((context.config.get("director") or {}).get("command_timeout") or 120)
        return min(float(MAX_HOLD), max(600.0, 3 * timeout + 60))

    def __init__(
        self, config: Mapping[str, Any], context: PluginContext, *, clock: Clock | None = None
    ) -> None:
        super().__init__(config, context)
        settings = self.settings
        self.mode = settings.mode
        self.categories = settings.categories
        # the waits are real: a submission thread blocks until its turn (tests inject a clock)
        self.clock = clock or SYSTEM_CLOCK
        self._lock = threading.Lock()
        self._local: dict[str, LocalTokens] = {}
        self._held: dict[str, tuple[str, Any]] = {}
        self._stats: dict[str, EndpointStats] = {}
        self._client: ProxyClient | None = None
        self._warned_privileged = False
        if self.mode == "local":
            limits = settings.limits()
            self._settings = PolicySettings(
                limits={c: limits for c in CATEGORIES},
                token_wait_time=settings.token_wait_time,
                queue_limit_per_user=settings.queue_limit,
                lease_time=self._lease_time(settings, context),
                admins=frozenset(),
            )
        else:
            section = ClientSettings.of(context.config.get("proxyd"))
            extra = {"user": settings.user} if settings.user else {}
            self._client = ProxyClient.from_settings(
                section,
                settings.socket or None,
                notoken_ntries=settings.notoken_ntries,
                when_unavailable="fail" if settings.when_unavailable == "refuse" else "proceed",
                **extra,
            )

    # --- bookkeeping ------------------------------------------------------------------------

    def _count(self, key: str, **changes: Any) -> None:
        with self._lock:
            old = self._stats.get(key, EndpointStats())
            values = {f: getattr(old, f) for f in EndpointStats.__dataclass_fields__}
            for field_name, change in changes.items():
                if field_name == "max_in_use":
                    values[field_name] = max(values[field_name], change)
                else:
                    values[field_name] += change
            self._stats[key] = EndpointStats(**values)

    def stats(self) -> dict[str, EndpointStats]:
        """Per endpoint key (``backend/name``, ``-`` for none): grants, waits, refusals."""
        with self._lock:
            return dict(self._stats)

    def in_use(self) -> dict[str, int]:
        """local: tokens held now per endpoint key (for tests and status)."""
        with self._lock:
            policies = dict(self._local)
        return {key: tokens.in_use() for key, tokens in policies.items()}

    def _policy_for(self, key: str) -> LocalTokens:
        with self._lock:
            tokens = self._local.get(key)
            if tokens is None:
                tokens = self._local[key] = LocalTokens(TokenPolicy(self._settings, self.clock))
            return tokens

    # --- hooks ------------------------------------------------------------------------------

    @hookimpl
    def gridgate_admit(self, request: AdmissionRequest) -> Grant | Refusal | None:
        if request.category not in self.categories:
            return None
        key = request.endpoint.key if request.endpoint is not None else NO_ENDPOINT
        if self.mode == "local":
            return self._admit_local(request, key)
        return self._admit_remote(request, key)

    def _admit_local(self, request: AdmissionRequest, key: str) -> Grant | Refusal:
        tokens = self._policy_for(key)
        # everyone is an ordinary user here, root included (see the module docstring)
        user = f"user:{request.user or 'director'}"
        decision = tokens.acquire(
            request.category, request.opcode, user, request.host, request.size
        )
        where = request.endpoint.name if request.endpoint is not None else "this host"
        if decision.outcome == GRANTED and decision.token is not None:
            in_use = tokens.in_use(request.category)
            with self._lock:
                self._held[decision.token.id] = ("local", (tokens, key))
            self._count(
                key,
                granted=1,
                waited=1 if decision.waited > 0 else 0,
                wait_seconds=decision.waited,
                max_in_use=in_use,
            )
            return Grant(
                issuer=self.name,
                token=decision.token.id,
                category=request.category,
                waited=decision.waited,
            )
        if decision.outcome == DENIED:
            self._count(key, refused=1)
            limits = tokens.policy.settings.limits[request.category]
            reason = {
                "timeout": f"no {request.category} token for {where} within "
                f"{tokens.policy.settings.token_wait_time:g} s "
                f"({limits.max} in flight)",
                "queue_full": f"too many submissions waiting for {where}",
            }.get(decision.reason, f"{decision.reason} for {where}")
            logger.info("admission refused: {}", reason)
            return Refusal(issuer=self.name, reason=reason)
        # proceed: the category is disabled, nothing to give back
        self._count(key, granted=1)
        return Grant(issuer=self.name, category=request.category, note=decision.reason)

    def _admit_remote(self, request: AdmissionRequest, key: str) -> Grant | Refusal:
        assert self._client is not None
        try:
            token = self._client.acquire(request.category, request.opcode, request.size)
        except NoToken as exc:
            self._count(key, refused=1)
            return Refusal(issuer=self.name, reason=f"lsfproxyd: {exc}")
        except ProxyUnavailable as exc:
            self._count(key, refused=1)
            return Refusal(issuer=self.name, reason=f"lsfproxyd unavailable: {exc}")
        except RequestFailed as exc:
            self._count(key, refused=1)
            return Refusal(issuer=self.name, reason=f"lsfproxyd refused the request: {exc}")
        self._count(key, granted=1, waited=1 if token.waited > 0 else 0, wait_seconds=token.waited)
        if token.proceed:
            return Grant(issuer=self.name, category=request.category, note=token.reason)
        if token.privileged and not self._warned_privileged:
            # the seed makes admins privileged, and heartbeats make the service account one:
            # then nothing the director submits is ever paced (issue 21)
            self._warned_privileged = True
            logger.warning(
                "lsf_proxy: lsfproxyd {} serves this director as privileged: its "
                "submissions are never paced. Leave its account out of "
                "proxyd.privileged (e.g. privileged: [root]; admin rights stay in "
                "proxyd.admins)",
                token.daemon or "",
            )
        with self._lock:
            self._held[token.id] = ("remote", token)
        return Grant(
            issuer=self.name, token=token.id, category=request.category, waited=token.waited
        )

    @hookimpl
    def gridgate_release(self, grant: Grant) -> None:
        if grant.issuer != self.name or not grant.token:
            return
        with self._lock:
            held = self._held.pop(grant.token, None)
        if held is None:
            logger.warning("lsf_proxy: release of unknown token {}", grant.token)
            return
        kind, value = held
        if kind == "local":
            tokens, _key = value
            tokens.release(grant.token)
        else:
            token: ClientToken = value
            token.release()

    def close(self) -> None:
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for kind, value in held:
            if kind == "remote":
                value.release()
        if self._client is not None:
            self._client.close()
