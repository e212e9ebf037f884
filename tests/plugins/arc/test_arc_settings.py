"""The `arc` section read once, typed (plugins/arc/settings.py): every default comes from the
schema, each endpoint is resolved once, and a key that would be accepted and then do nothing
is a config error naming the key that makes it inert."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridgate.core.config import ConfigError
from gridgate.core.testing import build_plugin, section_for
from gridgate.plugins.arc.backend import ArcBackend
from gridgate.plugins.arc.cli import CliInterface
from gridgate.plugins.arc.rest.interface import RestInterface
from gridgate.plugins.arc.settings import ARC_SCHEMA, ArcSettings, EndpointEntry

BASE = {"endpoints": ["https://ce.example.org/arex"], "script": "/p.sh"}


def test_the_defaults_are_the_schemas_own(tmp_path: Path) -> None:
    backend = build_plugin(ArcBackend, BASE, state_dir=tmp_path, name="arc")
    settings = backend.settings
    assert isinstance(settings, ArcSettings)
    for name in ("interface", "auth", "job_name", "stderr_samples", "stderr_bytes", "keep_on_ce"):
        assert getattr(settings, name) == ARC_SCHEMA["properties"][name]["default"], name
    assert settings.program("arcstat") == "arcstat" and settings.command_timeout is None


def test_each_endpoint_is_resolved_once_with_its_default_name(tmp_path: Path) -> None:
    section = {
        **BASE,
        "endpoints": [
            "https://ce.example.org:443/arex",
            {"url": "https://ce.example.org:8443/arex", "queue": "long"},
            {"url": "https://other.example.org/arex", "name": "other"},
        ],
    }
    backend = build_plugin(ArcBackend, section, state_dir=tmp_path, name="arc")
    assert backend.settings.entries == (
        EndpointEntry("https://ce.example.org:443/arex", "", "ce.example.org"),
        EndpointEntry("https://ce.example.org:8443/arex", "long", "ce.example.org:8443-long"),
        EndpointEntry("https://other.example.org/arex", "", "other"),
    )
    assert [e.name for e in backend.endpoints()] == [e.name for e in backend.settings.entries]


def test_a_client_command_given_with_the_rest_interface_is_a_config_error() -> None:
    """``commands`` run only with ``interface: cli``: with REST (the default) a path given for
    arcsub was accepted and never run."""
    section = {**BASE, "commands": {"arcsub": "/opt/arc/bin/arcsub"}}
    problems = ArcBackend.config_errors(section)
    assert [(p, "interface: cli" in m and "interface: rest" in m) for p, m in problems] == [
        (("commands", "arcsub"), True)
    ]
    with pytest.raises(ConfigError, match="commands.arcsub"):
        section_for(ArcBackend, section)
    assert ArcBackend.config_errors({**section, "interface": "cli"}) == []


@pytest.mark.parametrize(("interface", "held"), [("rest", RestInterface), ("cli", CliInterface)])
def test_the_backend_holds_the_one_interface_its_settings_name(
    tmp_path: Path, interface: str, held: type
) -> None:
    section = {**BASE, "interface": interface}
    backend = build_plugin(ArcBackend, section, state_dir=tmp_path, name="arc")
    assert type(backend.interface) is held
    assert backend.interface.settings is backend.settings, "built with the typed section"
    assert not hasattr(backend.interface, "owner") and not hasattr(backend, "rest")
