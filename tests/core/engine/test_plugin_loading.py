"""Plugin discovery reads the installed entry points, not a stale copy of them.

stevedore's on-disk cache is keyed by sys.path mtimes packed as 32-bit floats (128 s
resolution today), so right after an upgrade it can return the old entry points. gridgate's
loader asks importlib.metadata instead; these tests hand stevedore a stale cache and check
that nothing notices."""

from __future__ import annotations

import importlib.metadata

import pytest
from stevedore import _cache

from gridgate.core.engine.loader import cli_plugin_manager
from gridgate.core.plugins import SECTIONS_GROUP, load_class
from gridgate.plugins.lsf_proxy.section import ProxydSection


@pytest.fixture
def stale_stevedore_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """What stevedore returned here after ProxydSection moved to its own module, for every group."""
    moved = importlib.metadata.EntryPoint(
        name="proxyd", value="gridgate.plugins.lsf_proxy.config:ProxydSection", group=SECTIONS_GROUP
    )
    monkeypatch.setattr(
        _cache, "get_group_all", lambda group, path=None: [moved] if group == SECTIONS_GROUP else []
    )
    from stevedore import ExtensionManager

    monkeypatch.setattr(ExtensionManager, "ENTRY_POINT_CACHE", {})


def test_a_stale_stevedore_cache_does_not_hide_a_moved_plugin(stale_stevedore_cache) -> None:
    from stevedore import NamedExtensionManager

    # stevedore on its own is fooled...
    failures = []
    NamedExtensionManager(
        namespace=SECTIONS_GROUP,
        names=["proxyd"],
        on_load_failure_callback=lambda _m, _ep, err: failures.append(err),
    )
    assert failures and "ProxydSection" in str(failures[0])
    # ...gridgate's loader is not
    assert load_class(SECTIONS_GROUP, "proxyd") is ProxydSection


def test_a_stale_stevedore_cache_does_not_hide_commands(stale_stevedore_cache) -> None:
    pm = cli_plugin_manager(on_error=lambda error: pytest.fail(str(error)))
    names = {name for name, _plugin in pm.list_name_plugin()}
    assert {"cli:lsf_proxy", "cli:lsf_gate", "cli:outbox", "cli:demo"} <= names
