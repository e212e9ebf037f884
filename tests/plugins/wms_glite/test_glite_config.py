"""The wms_glite section through core's real config loader and plugin loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from gridgate.core.config import ConfigError, load_config
from gridgate.core.engine.loader import build_plugin_manager
from gridgate.core.model import SubmitRequest
from gridgate.core.plugins import PluginContext
from gridgate.plugins.wms_glite.backend import GliteBackend, build_jdl

GOOD = """\
state: {driver: memory}
backends:
  wms_glite:
    servers: [wms01.example.org, "https://wms02.example.org:7443/glite_wms_wmproxy_server"]
    delegation: pilot-deleg
    list_match: false
    arguments: 'say "hi" $(touch x)'
    rules:
      - {kind: quota, pattern: "too many jobs"}
"""


def test_a_site_config_loads_with_defaults_and_the_entry_point(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(GOOD)
    config = load_config(path)
    section = config["backends"]["wms_glite"]
    assert section["list_match_cache"] == 900 and section["rules"][0]["stream"] == "any"
    pm, instances = build_plugin_manager(config.data, PluginContext(config=config.data))
    try:
        (backend,) = [i for i in instances if isinstance(i, GliteBackend)]
        assert backend.name == "wms_glite"
        info = pm.hook.gridgate_backend_info(backend="wms_glite")
        assert [e.name for e in info.endpoints] == ["wms01.example.org", "wms02.example.org"]
        assert info.list_match is False
        assert backend.argv("Job Submit", info.endpoints[0], "/tmp/j.jdl")[4:6] == [
            "-d",
            "pilot-deleg",
        ]
        jdl = build_jdl(section, SubmitRequest("wms_glite"))
        assert 'Arguments = "say \\"hi\\" $(touch x)";' in jdl
    finally:
        for instance in instances:
            instance.close()


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "backends:\n  wms_glite:\n    servers: [a.example.org, a.example.org]\n",
            "backends.wms_glite.servers[1]: duplicate server 'a.example.org'",
        ),
        (
            "backends:\n  wms_glite:\n    delegation: 'x y'\n",
            "backends.wms_glite.delegation: delegation id 'x y'",
        ),
        ("backends:\n  wms_glite:\n    output_format: xml\n", "backends.wms_glite.output_format"),
        ("backends:\n  wms_glite:\n    servrs: []\n", "backends.wms_glite"),
    ],
)
def test_bad_sections_are_refused_with_their_path(
    tmp_path: Path, yaml_text: str, expected: str
) -> None:
    path = tmp_path / "site.yaml"
    path.write_text("state: {driver: memory}\n" + yaml_text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert expected in str(caught.value)
    assert f"{path}:" in str(caught.value)
