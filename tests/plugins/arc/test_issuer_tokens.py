"""The ``bearer_token`` credential fetching its own token from an issuer (``issuer:``: the OAuth2
client-credentials grant, core/builtin/token_issuer.py) against the real private issuer over
https: the token is kept private and handed out, renewed before its end without a pause; a
wrong secret, a revoked client, a scope not allowed, a 500, a hang and a TLS failure make the
credential unusable with the issuer's reason, blame no CE, and never print the secret. One
test submits to the real A-REX with a fetched token."""

from __future__ import annotations

import base64
import json
import stat
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.redis_server import RedisServer

from gridgate.core import hookimpl
from gridgate.core.builtin.bearer_token import COPY_NAME, BearerToken
from gridgate.core.clock import SYSTEM_CLOCK, FakeClock
from gridgate.core.model import (
    BackendInfo,
    Endpoint,
    JobStatus,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.runner import run
from gridgate.core.state import StateStore, open_state
from gridgate.core.testing import Collector, build_plugin, director_for

SCOPE = "compute.create compute.read"
AUDIENCE = "https://ce1.example.org"


def claims(token: str) -> dict[str, Any]:
    part = token.strip().split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


class Client:
    """A client registered with the issuer, its secret in a private file, and the
    ``credentials.bearer_token`` section that names them."""

    def __init__(self, served, folder: Path, *, lifetime: int = 1200) -> None:
        self.served = served
        self.secret = served.issuer.add_client(
            "factory", scopes=SCOPE, audiences=[AUDIENCE], lifetime=lifetime
        )
        self.secret_file = folder / "factory.secret"
        self.secret_file.write_text(self.secret + "\n")
        self.secret_file.chmod(0o600)
        self.state = folder / "state"

    def issuer(self, **changes: Any) -> dict[str, Any]:
        block = {
            "url": self.served.url,
            "client_id": "factory",
            "client_secret": {"file": str(self.secret_file)},
            "scope": SCOPE,
            "audience": AUDIENCE,
            "ca_path": str(self.served.ca_path),
        }
        return {**block, **changes}

    def section(self, **changes: Any) -> dict[str, Any]:
        return {"issuer": self.issuer(**changes.pop("issuer", {})), **changes}

    def plugin(self, clock, **changes: Any) -> BearerToken:
        return build_plugin(BearerToken, self.section(**changes), clock=clock, state_dir=self.state)

    def requests(self) -> int:
        """Token requests the issuer served so far."""
        return self.served.server.served.count("/token")


@pytest.fixture
def clock(token_issuer) -> FakeClock:
    """A clock that the issuer's tokens follow too: a test moves both."""
    fake = FakeClock(time.time())
    token_issuer.issuer.clock = fake
    return fake


@pytest.fixture
def client(token_issuer, tmp_path: Path) -> Client:
    return Client(token_issuer, tmp_path)


def test_a_fetched_token_is_kept_private_handed_out_and_fetched_again_only_when_short(
    client: Client, clock: FakeClock
) -> None:
    plugin = client.plugin(clock, min_lifetime=600)
    status = plugin.check(30)
    assert status.usable and status.renewed, status.message
    path = client.state / COPY_NAME
    assert status.path == str(path) and status.command is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    token = path.read_text()
    got = claims(token)
    assert (got["scope"], got["aud"], got["sub"]) == (SCOPE, AUDIENCE, "factory")
    assert got["iss"] == client.served.url and status.expires == got["exp"]
    assert plugin.gridgate_credential_env(kind="token") == {"BEARER_TOKEN_FILE": str(path)}
    assert client.requests() == 1
    clock.advance(500)  # 700 s left, more than min_lifetime: no request
    assert plugin.check(30).usable and client.requests() == 1 and path.read_text() == token
    clock.advance(200)  # 500 s left: a new token, before the old one ends
    renewed = plugin.check(30)
    assert renewed.usable and renewed.renewed and client.requests() == 2
    assert path.read_text() != token and renewed.expires == claims(path.read_text())["exp"]
    assert renewed.expires is not None and renewed.expires - clock.time() >= 1199
    plugin.close()


class TokenBackend:
    """A backend that needs a bearer token: each submission runs a real program handed
    ``context.credential_env("token")`` that prints the token it finds there."""

    name = "arcrest"

    def __init__(self) -> None:
        self.endpoints = (Endpoint(self.name, "ce1"), Endpoint(self.name, "ce2"))
        self.context: Any = None
        self.tokens: list[str] = []
        self.lock = threading.Lock()

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        if backend != self.name:
            return None
        return BackendInfo(self.name, self.endpoints, credentials=("token",))

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        env = {"PATH": "/usr/bin:/bin", **self.context.credential_env("token")}
        code = "import os; print(open(os.environ['BEARER_TOKEN_FILE']).read().strip())"
        result = run([sys.executable, "-c", code], timeout=timeout, env=env)
        with self.lock:
            self.tokens.append(result.stdout.strip())
        return SubmitResult(endpoint, ok=result.ok, job_ids=(f"j{len(self.tokens)}",))

    @hookimpl
    def gridgate_job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        statuses = {j: JobStatus(j, "waiting") for j in job_ids}
        return StatusResult(endpoint, ok=True, statuses=statuses)


def director(client: Client, clock: FakeClock, collector: Collector, **section: Any):
    backend = TokenBackend()
    doc = {
        "director": {
            "cycle_seconds": 60,
            "command_timeout": 5,
            "max_threads": 2,
            "ticket_expiry": 3600,
            "state_dir": str(client.state),
        },
        "demand": {"static": {"arcrest": 2}},
        "credentials": {"bearer_token": client.section(min_lifetime=600, **section)},
    }
    made = director_for(doc, backend, collector, clock=clock)
    backend.context = made.context
    return made, backend


def test_the_director_submits_with_the_fetched_token_and_renews_it_without_a_pause(
    client: Client, clock: FakeClock
) -> None:
    collector = Collector()
    made, backend = director(client, clock, collector)
    try:
        first = made.run_iteration()
        assert {r.outcome for r in first.records} == {"submitted"}
        (token,) = set(backend.tokens)
        assert claims(token)["aud"] == AUDIENCE
        clock.advance(700)  # less than min_lifetime left: renewed before anything is submitted
        second = made.run_iteration()
        assert {r.outcome for r in second.records} == {"submitted"}
        assert second.credentials[0].renewed and client.requests() == 2
        assert set(backend.tokens[2:]) == {(client.state / COPY_NAME).read_text().strip()}
        assert (
            backend.tokens[2] != token and claims(backend.tokens[2])["exp"] > claims(token)["exp"]
        )
        assert [n.level for n in collector.notes] == []  # no pause, nobody told
    finally:
        made.close()


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        ("wrong-secret", "invalid_client (HTTP 401): Bad client credentials"),
        ("revoked", "invalid_client (HTTP 401): Bad client credentials"),
        ("scope", "invalid_scope (HTTP 400): scope not allowed: compute.cancel"),
        ("audience", "invalid_target (HTTP 400): audience not allowed: https://other.org"),
        ("500", "HTTP 500 Internal Server Error"),
        ("hang", "no complete answer within the deadline of 5 s"),
        ("tls", "certificate verify failed"),
    ],
)
def test_an_issuer_that_gives_no_token_makes_the_credential_unusable_and_blames_no_ce(
    client: Client,
    clock: FakeClock,
    tmp_path: Path,
    logs: list[str],
    breakage: str,
    reason: str,
) -> None:
    issuer: dict[str, Any] = {}
    if breakage == "wrong-secret":
        client.secret_file.write_text("not-the-secret\n")
    elif breakage == "revoked":
        client.served.issuer.revoke_client("factory")
    elif breakage == "scope":
        issuer["scope"] = "compute.create compute.cancel"
    elif breakage == "audience":
        issuer["audience"] = "https://other.org"
    elif breakage in ("500", "hang"):
        client.served.server.token_fault = breakage
    elif breakage == "tls":
        empty = tmp_path / "no-cas"
        empty.mkdir()
        issuer["ca_path"] = str(empty)
    collector = Collector()
    made, backend = director(client, clock, collector, issuer=issuer)
    try:
        paused = made.run_iteration()
        clock.advance(60)
        again = made.run_iteration()
    finally:
        made.close()
    for it in (paused, again):
        assert {(r.outcome, r.failure_kind) for r in it.records} == {("skipped", "credential")}
        assert it.excluded == () and it.failures == ()  # no CE blamed
        (status,) = it.credentials
        assert not status.usable and reason in status.message, status.message
        assert f"the token request to {client.served.url} (client factory) failed" in status.message
    assert backend.tokens == []
    counts = made.failing.counts()
    assert counts["failing"] == 0 and counts["tickets"] == 0
    (error,) = collector.notes  # told once for the episode
    assert error.level == "error" and error.failure is not None
    assert error.failure.kind == "credential" and error.endpoint is None
    assert reason in error.body or reason in error.subject
    said = "\n".join(logs) + "".join(n.subject + n.body for n in collector.notes)
    assert client.secret not in said and client.secret not in status.message
    assert not (client.state / COPY_NAME).exists()


def test_a_revoked_client_keeps_its_token_until_the_end_then_the_credential_is_unusable(
    client: Client, clock: FakeClock
) -> None:
    plugin = client.plugin(clock, min_lifetime=600)
    assert plugin.check(30).usable
    client.served.issuer.revoke_client("factory")
    clock.advance(700)  # short: the renewal is refused, the token still works
    short = plugin.check(30)
    assert short.usable and short.renewal_due and not short.renewed
    assert "invalid_client (HTTP 401)" in short.message and "left" in short.message
    clock.advance(600)  # past its end
    ended = plugin.check(30)
    assert not ended.usable and "expired at" in ended.message
    assert "invalid_client (HTTP 401)" in ended.message


def test_an_unreadable_secret_file_is_named_and_nothing_is_asked(
    client: Client, clock: FakeClock
) -> None:
    client.secret_file.chmod(0o644)
    status = client.plugin(clock).check(30)
    assert not status.usable and "the client secret" in status.message
    assert "0644" in status.message and client.secret not in status.message
    assert client.requests() == 0


def shared(
    client: Client, clock: FakeClock, store: StateStore, folder: Path, **changes: Any
) -> BearerToken:
    """The credential of one director (its own state folder) on the store ``store``."""
    section = client.section(**changes)
    return build_plugin(BearerToken, section, clock=clock, state=store, state_dir=folder)


def test_directors_on_one_store_share_one_fetched_token_that_the_store_holds_sealed(
    client: Client, clock: FakeClock, tmp_path: Path
) -> None:
    shared_db = {"state": {"driver": "sqlite", "path": str(tmp_path / "shared" / "state.db")}}
    stores = [open_state(shared_db, clock) for _ in range(3)]
    folders = [tmp_path / f"director{i}" for i in range(4)]
    a, b = (shared(client, clock, stores[i], folders[i], min_lifetime=600) for i in range(2))
    try:
        assert a.check(30).renewed and client.requests() == 1
        taken = b.check(30)
        assert taken.usable and taken.renewed and client.requests() == 1, taken.message
        token = (folders[0] / COPY_NAME).read_text()
        assert (folders[1] / COPY_NAME).read_text() == token
        assert stat.S_IMODE((folders[1] / COPY_NAME).stat().st_mode) == 0o600
        # the store holds it sealed: neither the token nor its claims can be read there
        (raw,) = [value for _key, value in stores[2].items("credential-token/")]
        assert token.strip() not in raw and token.split(".")[1] not in raw
        assert "factory" not in raw and client.secret not in raw
        # short again: the first director to look fetches and shares, the other takes it
        clock.advance(700)
        assert b.check(30).renewed and client.requests() == 2
        assert a.check(30).renewed and client.requests() == 2
        renewed = (folders[0] / COPY_NAME).read_text()
        assert renewed != token and (folders[1] / COPY_NAME).read_text() == renewed
        # a director that wants more than the shared token has left fetches its own
        clock.advance(150)
        longer = shared(client, clock, stores[2], folders[2], min_lifetime=1100)
        assert longer.check(30).renewed and client.requests() == 3
        assert claims((folders[2] / COPY_NAME).read_text())["exp"] > claims(renewed)["exp"]
        # share: false keeps its own, whatever the store holds
        own = shared(client, clock, stores[2], folders[3], issuer={"share": False})
        assert own.check(30).renewed and client.requests() == 4
    finally:
        for store in stores:
            store.close()


def test_a_shared_token_sealed_with_another_secret_or_damaged_is_fetched_again_and_replaced(
    client: Client, clock: FakeClock, tmp_path: Path, logs: list[str]
) -> None:
    store = open_state({"state": {"driver": "memory"}}, clock)
    first = shared(client, clock, store, tmp_path / "one")
    assert first.check(30).renewed and client.requests() == 1
    # the client's secret is rotated: the entry sealed with the old one is no use
    new_secret = client.served.issuer.add_client(
        "factory", scopes=SCOPE, audiences=[AUDIENCE], lifetime=1200
    )
    client.secret_file.write_text(new_secret + "\n")
    rotated = shared(client, clock, store, tmp_path / "two")
    assert rotated.check(30).renewed and client.requests() == 2
    # ... and is replaced: a third director with the new secret takes the new token
    third = shared(client, clock, store, tmp_path / "three")
    assert third.check(30).renewed and client.requests() == 2
    assert (tmp_path / "three" / COPY_NAME).read_text() == (
        tmp_path / "two" / COPY_NAME
    ).read_text()
    # an entry that is not one: said, fetched again
    ((key, _value),) = store.items("credential-token/")
    store.set(key, '{"v": 1, "sealed": 7}')
    fourth = shared(client, clock, store, tmp_path / "four")
    assert fourth.check(30).renewed and client.requests() == 3
    assert any("the shared token in the state store is damaged" in line for line in logs)
    said = "\n".join(logs)
    assert new_secret not in said and client.secret not in said


def test_four_directors_renewing_at_once_on_redis_ask_the_issuer_once(
    client: Client, clock: FakeClock, tmp_path: Path
) -> None:
    with RedisServer(tmp_path / "redis") as server:
        conf = {"state": {"driver": "redis", "url": server.url, "prefix": "share:"}}
        stores = [open_state(conf, clock) for _ in range(4)]
        plugins = [
            shared(client, clock, store, tmp_path / f"d{i}") for i, store in enumerate(stores)
        ]
        start = threading.Barrier(len(plugins))
        statuses: list[Any] = [None] * len(plugins)

        def renew(i: int) -> None:
            start.wait(10)
            statuses[i] = plugins[i].check(30)

        threads = [threading.Thread(target=renew, args=(i,)) for i in range(len(plugins))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        try:
            assert all(s is not None and s.usable and s.renewed for s in statuses), statuses
            assert client.requests() == 1
            tokens = {(tmp_path / f"d{i}" / COPY_NAME).read_text() for i in range(4)}
            assert len(tokens) == 1
            assert server.client().keys("share:credential-token/*/fetching") == []
        finally:
            for store in stores:
                store.close()


def config_errors(tmp_path: Path, section: dict[str, Any]) -> str:
    site = tmp_path / "site.yaml"
    doc = {"director": {"paused": True}, "credentials": {"bearer_token": section}}
    site.write_text(yaml.safe_dump(doc, sort_keys=False))
    gridgate = str(Path(sys.executable).parent / "gridgate")
    result = run([gridgate, "config", "validate", str(site)], 60)
    assert result.returncode == 2, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_issuer_beside_renew_or_path_is_a_config_error_naming_the_line(
    client: Client, tmp_path: Path
) -> None:
    text = config_errors(tmp_path, client.section(renew=["htgettoken"], path="token"))
    site = tmp_path / "site.yaml"
    lines = site.read_text().splitlines()
    renew_line = next(i for i, line in enumerate(lines, 1) if line.strip().startswith("renew"))
    path_line = next(i for i, line in enumerate(lines, 1) if line.strip().startswith("path"))
    assert f"{site}:{renew_line}:" in text and "renew and issuer both renew" in text, text
    assert f"{site}:{path_line}:" in text and "path and issuer" in text, text
    text = config_errors(tmp_path, {"issuer": {"url": "http://iam.example.org", "client_id": "f"}})
    assert "credentials.bearer_token.issuer" in text and "client_secret" in text, text
    assert "url" in text, text
    assert client.secret not in text


@pytest.mark.xdist_group("arc")  # on the worker that holds the fork CE already
def test_a_token_fetched_from_the_ces_issuer_creates_a_job_on_the_real_a_rex(
    arc, rest, tmp_path: Path
) -> None:
    ce_url = f"https://localhost:{arc.port}"
    secret = arc.issuer.add_client(
        "gg-factory", scopes="compute.create compute.read", audiences=[ce_url], lifetime=1200
    )
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    section = {
        "issuer": {
            "url": arc.issuer_url,
            "client_id": "gg-factory",
            "client_secret": {"file": str(secret_file)},
            "scope": "compute.create compute.read",
            "audience": ce_url,
            "ca_path": str(arc.certificates),
        }
    }
    try:
        # the system's clock, as the CE's issuer (another process) has: a clock frozen before
        # the request would find the token's nbf (the issuer's now) still ahead
        plugin = build_plugin(BearerToken, section, clock=SYSTEM_CLOCK, state_dir=tmp_path)
        status = plugin.check(60)
        assert status.usable and status.renewed, status.message
        token = Path(plugin.env()["BEARER_TOKEN_FILE"]).read_text().strip()
        created = rest(
            arc,
            "POST",
            "/jobs?action=new",
            token,
            '&(executable="/bin/true")(jobname="gg-fetched")',
        )
        assert (created.status, created.reason) == (201, "Created"), created
        job = created.json()["job"]
        assert (job["status-code"], job["state"]) == ("201", "ACCEPTING"), job
        cleaned = rest(arc, "POST", "/jobs?action=clean", token, {"job": [{"id": job["id"]}]})
        assert cleaned.status in (200, 201), cleaned
    finally:
        arc.issuer.revoke_client("gg-factory")
