"""A JDL attribute name or a server name with a trailing newline: ``$`` took it, and the JDL
parser reads ``Executable\\n = ...`` as Executable, so the pilot itself could be replaced
(issue 21, items 12 and 16)."""

from __future__ import annotations

from typing import Any

import pytest

from gridgate.core.config import ConfigError, apply_defaults
from gridgate.core.model import SubmitRequest
from gridgate.core.testing import section_for
from gridgate.plugins.wms_glite.backend import GliteBackend, build_jdl
from gridgate.plugins.wms_glite.jdl import JdlError


def _config(**overrides: Any) -> dict[str, Any]:
    section: dict[str, Any] = dict(overrides)
    apply_defaults(section, GliteBackend.config_schema)
    return section


@pytest.mark.parametrize("name", ["Executable\n", "executable\n", "Requirements\n"])
def test_a_demand_attribute_named_with_a_newline_cannot_replace_a_reserved_one(name: str) -> None:
    # request.attributes come from demand plugins, past the config schema
    with pytest.raises(JdlError, match="not a valid attribute name"):
        build_jdl(
            _config(executable="pilot.sh"),
            SubmitRequest("wms_glite", attributes={name: "/bin/evil"}),
        )


def test_reserved_names_stay_refused_in_any_case() -> None:
    with pytest.raises(JdlError, match="set by gridgate itself"):
        build_jdl(_config(), SubmitRequest("wms_glite", attributes={"eXecutable": "/bin/evil"}))


@pytest.mark.parametrize(
    "server",
    [
        "https://wms01.example.org\n:7443/glite_wms_wmproxy_server",
        "https://wms01.example.org:7443/glite_wms\twmproxy_server",
        "wms\n01.example.org",
    ],
)
def test_a_server_with_a_newline_inside_is_refused(server: str) -> None:
    # urlsplit drops the newline before parsing; the raw text was the endpoint's URL
    with pytest.raises(ConfigError):
        section_for(GliteBackend, {"servers": [server]})


def test_a_delegation_id_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(ConfigError):
        section_for(GliteBackend, {"servers": ["wms01.example.org"], "delegation": "mine\n"})
