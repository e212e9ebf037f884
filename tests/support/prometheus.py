"""A real Prometheus server over the shipped rules (deploy/prometheus/gridgate-rules.yml) for the
alert tests: every ``for`` cut to 0 s and the numbers a test names changed in the file's text, as
a site changes them; scrape and evaluation every second."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gridgate.core.devkit.services import free_port
from support.polling import until

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "gridgate-rules.yml"
PROMETHEUS = "/usr/bin/prometheus"
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}


def wait_for(what: str, probe: Any, deadline: float = 120) -> Any:
    """``probe()`` once it is truthy (polled with support.polling.until; a port not yet
    listening counts as not yet)."""

    def attempt() -> Any:
        try:
            return probe()
        except OSError:
            return None

    found = until(attempt, timeout=deadline, pause=0.5)
    assert found, f"{what}: not within {deadline} s"
    return found


class Prometheus:
    def __init__(
        self, folder: Path, targets: dict[str, int], edits: dict[str, str] | None = None
    ) -> None:
        self.folder = folder
        self.port = free_port()
        # the shipped rules, with every `for` cut to 0 s (the test cannot wait hours) and the
        # numbers in `edits` changed as a site changes them, in the file's text
        text = RULES.read_text(encoding="utf-8")
        for number, shorter in (edits or {}).items():
            assert number in text, f"the rules hold no {number!r} to edit"
            text = text.replace(number, shorter)
        rules = yaml.safe_load(text)
        for group in rules["groups"]:
            for rule in group["rules"]:
                rule["for"] = "0s"
        (folder / "rules.yml").write_text(yaml.safe_dump(rules), encoding="utf-8")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yml"],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                for job, port in targets.items()
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        self.log = open(folder / "prometheus.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=ENV,
            cwd=folder,
        )
        wait_for("prometheus ready", lambda: self.get("/-/ready", raw=True))

    def get(self, path: str, raw: bool = False, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = answer.read().decode("utf-8")
        return body if raw else json.loads(body)

    def firing(self) -> list[dict[str, Any]]:
        alerts = self.get("/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["state"] == "firing"]

    def value(self, query: str) -> float:
        """What ``query`` sums to now (0 when it has no series)."""
        result = self.get("/api/v1/query", query=query)["data"]["result"]
        return sum(float(r["value"][1]) for r in result)

    def wait_seen(self, query: str, more: float, deadline: float = 120) -> None:
        """Until ``query`` has grown by ``more`` from now, and every rule group has been
        evaluated on what was scraped by then: events Prometheus saw, not a pause."""
        start = self.value(query)
        wait_for(f"{query} up by {more:g}", lambda: self.value(query) >= start + more, deadline)
        seen = time.time()
        wait_for("the rules evaluated on it", lambda: self._evaluated_after(seen), deadline)

    def _evaluated_after(self, moment: float) -> bool:
        groups = self.get("/api/v1/rules")["data"]["groups"]
        return bool(groups) and all(_rfc3339(g["lastEvaluation"]) > moment for g in groups)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture
def prometheus_factory(tmp_path: Path):
    """``prometheus_factory(targets, edits)``: a :class:`Prometheus` scraping ``targets``
    (job name -> port), stopped after the test."""
    started: list[Prometheus] = []

    def start(targets: dict[str, int], edits: dict[str, str] | None = None) -> Prometheus:
        server = Prometheus(tmp_path / "prom", targets, edits)
        started.append(server)
        return server

    (tmp_path / "prom").mkdir()
    yield start
    for server in started:
        server.stop()


def firing(prom: Prometheus, name: str) -> list[dict[str, Any]]:
    """The alerts named ``name`` firing now."""
    return [a for a in prom.firing() if a["labels"]["alertname"] == name]


def _rfc3339(text: str) -> float:
    """Unix time of Prometheus's ``2026-12-06T07:30:00.123456789Z`` (nanoseconds cut)."""
    whole, _, rest = text.rstrip("Z").partition(".")
    fraction = float(f"0.{rest[:6]}") if rest else 0.0
    return datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp() + fraction
