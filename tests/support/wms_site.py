"""A director site on the stand-in gLite WMS whose one server accepts every pilot: what the
tests of ``gridgate run`` (the process, its metrics, its stop) start from."""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path
from typing import Any

import yaml


def healthy_wms(folder: Path) -> dict[str, Any]:
    """The ``backends.wms_glite`` section of one healthy stand-in server, its commands and
    scenario installed under ``folder``."""
    from gridgate.plugins.wms_glite.sim import install_commands, write_scenario

    bin_dir = install_commands(folder / "bin")
    scenario = write_scenario(
        folder / "scenario.json",
        {"state_dir": str(folder / "simstate"), "default": {"behaviour": "healthy"}},
    )
    return {
        "servers": ["wms01.example.org"],
        "commands": {"submit": str(bin_dir / "glite-wms-job-submit")},
        "list_match": False,
        "env": {"GRIDGATE_SIM_SCENARIO": str(scenario)},
    }


def director_section(folder: Path, cycle_seconds: float, **more: Any) -> dict[str, Any]:
    """A ``director`` section with its state under ``folder``."""
    return {
        "cycle_seconds": cycle_seconds,
        "max_threads": 2,
        "command_timeout": 30,
        "state_dir": str(folder / "state"),
        **more,
    }


def fake_jwt(expires: float) -> str:
    """A token as a token tool writes it: the director reads its ``exp`` and never checks the
    signature (the CE does)."""

    def part(doc: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

    claims = {"iss": "https://issuer.example.org", "sub": "pilots", "exp": int(expires)}
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


def director_site(
    folder: Path, metrics_port: int, token: Path, min_lifetime: int = 60, **director: Any
) -> Path:
    doc = {
        "director": director_section(folder, 1, metrics_port=metrics_port, **director),
        "state": {"driver": "memory"},
        "backends": {"wms_glite": healthy_wms(folder)},
        "demand": {"static": {"wms_glite": 1}},
        "credentials": {"bearer_token": {"path": str(token), "min_lifetime": min_lifetime}},
    }
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def scrape(port: int) -> str:
    """The /metrics page a process serves on ``port`` (loopback)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.read().decode("utf-8")
