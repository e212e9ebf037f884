"""Fixtures of the REST path's tests, on top of the private CE of tests/plugins/arc/conftest.py:

- ``rest_backend(ce, tmp_path, **section)``: an ``arc`` backend with ``interface: rest`` on
  ``ce`` (its proxy from the section's env, a memory state store, the real clock);
- ``witness(ce)``: the CE asked directly with the standard library's http.client (never the
  code under test): its delegations, a job's state and name, deleting a delegation;
- ``relay(ce, ...)``: a TLS-terminating HTTP relay on its own port of localhost, presenting
  the CE's own host certificate, that forwards every request to the CE with the test's proxy
  and can lose the answers to chosen requests or close connections as soon as they are idle:
  a CE whose answer never arrives, or which closes a kept-alive connection, on demand.
"""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.relay import Relay

from gridgate.core.clock import SYSTEM_CLOCK
from gridgate.core.state import open_state
from gridgate.core.testing import build_plugin
from gridgate.plugins.arc.backend import ArcBackend

PILOT = "#!/bin/sh\necho rest pilot on $(hostname)\nexit 0\n"


def _context(ce: Any, proxy: str | Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(capath=str(ce.certificates))
    context.load_cert_chain(str(proxy or ce.proxy))
    return context


class Witness:
    """The CE's own answers, read with http.client and the CE's proxy."""

    def __init__(self, ce: Any, proxy: str | Path | None = None) -> None:
        self.ce = ce
        self.context = _context(ce, proxy)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, str, bytes]:
        conn = http.client.HTTPSConnection(
            "localhost", self.ce.port, context=self.context, timeout=60
        )
        try:
            data = json.dumps(body).encode() if isinstance(body, dict) else body
            headers = {"Accept": "application/json"}
            if isinstance(body, dict):
                headers["Content-Type"] = "application/json"
            conn.request(method, f"/arex/rest/1.0/{path}", body=data, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.reason, answer.read()
        finally:
            conn.close()

    def delegations(self) -> list[str]:
        _status, _reason, body = self.call("GET", "delegations")
        if not body.strip():
            return []
        items = json.loads(body)["delegation"]
        return [i["id"] for i in (items if isinstance(items, list) else [items])]

    def delegation_cert(self, identifier: str) -> bytes:
        status, reason, body = self.call("POST", f"delegations/{identifier}?action=get")
        assert status == 200, (status, reason)
        return body

    def delete_delegation(self, identifier: str) -> None:
        status, reason, _ = self.call("POST", f"delegations/{identifier}?action=delete")
        assert status in (200, 202), (status, reason)

    def jobs(self, action: str, ids: list[str]) -> list[dict[str, Any]]:
        status, reason, body = self.call(
            "POST", f"jobs?action={action}", {"job": [{"id": i.rsplit("/", 1)[-1]} for i in ids]}
        )
        assert status == 201, (status, reason, body)
        items = json.loads(body)["job"]
        return items if isinstance(items, list) else [items]

    def states(self, ids: list[str]) -> dict[str, str]:
        """CE id -> state ("None" for a job the CE does not have)."""
        return {e["id"]: e["state"] for e in self.jobs("status", ids)}

    def names(self) -> list[str]:
        """The names of every job of this DN on the CE."""
        status, _reason, body = self.call("GET", "jobs")
        if not body.strip():
            return []
        items = json.loads(body)["job"]
        ids = [i["id"] for i in (items if isinstance(items, list) else [items])]
        infos = self.jobs("info", ids)
        return [name_in(e) for e in infos]

    def seen(self) -> list[tuple[str, str, str]]:
        """(id, state, name) of every job of this DN on the CE."""
        status, _reason, body = self.call("GET", "jobs")
        items = json.loads(body)["job"] if status == 200 and body.strip() else []
        ids = [i["id"] for i in (items if isinstance(items, list) else [items])]
        if not ids:
            return []
        infos = self.jobs("info", ids)
        states = self.jobs("status", ids)
        return [
            (s["id"], s.get("state", ""), name_in(i)) for s, i in zip(states, infos, strict=True)
        ]


def name_in(entry: dict[str, Any]) -> str:
    """The job name of an ``info`` entry; "" for a job too young for an info document (A-REX
    gives a text where the document goes)."""
    document = entry.get("info_document")
    activity = document.get("ComputingActivity", {}) if isinstance(document, dict) else {}
    return str(activity.get("Name", "")) if isinstance(activity, dict) else ""


@pytest.fixture
def witness():
    return Witness


@pytest.fixture
def relay() -> Iterator[Callable[..., Relay]]:
    relays: list[Relay] = []

    def start(ce, proxy, **options) -> Relay:
        host = Path(ce.folder) / "host"
        made = Relay(
            ce.port, _context(ce, proxy), host / "hostcert.pem", host / "hostkey.pem", **options
        )
        made.url += "/arex"
        relays.append(made)
        return made

    yield start
    for made in relays:
        made.stop()


class RestSite:
    """A REST backend's files: a copy of the CE's proxy and a pilot script."""

    def __init__(self, ce: Any, folder: Path, pilot: str = PILOT) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.ce = ce
        self.folder = folder
        self.proxy = folder / "proxy.pem"
        shutil.copyfile(ce.proxy, self.proxy)
        self.proxy.chmod(0o600)
        self.script = folder / "pilot.sh"
        self.script.write_text(pilot, encoding="utf-8")
        self.script.chmod(0o755)
        self.state = open_state({"state": {"driver": "memory"}}, SYSTEM_CLOCK)

    def section(self, url: str | None = None, **extra: Any) -> dict[str, Any]:
        return {
            "interface": "rest",
            "endpoints": [url or self.ce.url],
            "script": str(self.script),
            "env": {
                "X509_CERT_DIR": str(self.ce.certificates),
                "X509_USER_PROXY": str(self.proxy),
                **extra.pop("env", {}),
            },
            "command_timeout": 60,
            **extra,
        }

    def backend(
        self, url: str | None = None, config: dict | None = None, **extra: Any
    ) -> ArcBackend:
        return build_plugin(
            ArcBackend,
            self.section(url, **extra),
            clock=SYSTEM_CLOCK,
            state=self.state,
            state_dir=self.folder / "state",
            name="arc",
            config=config or {},
        )


@pytest.fixture
def rest_site(tmp_path):
    """``rest_site(ce, name="site", pilot=PILOT)``: a :class:`RestSite` in the test's folder."""

    def make(ce, name: str = "site", pilot: str = PILOT) -> RestSite:
        return RestSite(ce, tmp_path / name, pilot)

    return make
