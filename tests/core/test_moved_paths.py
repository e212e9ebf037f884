"""The internal paths of API 1.4 that moved in 1.5 keep importing until 2.0, each with a
DeprecationWarning that names where it lives now (gridgate.core.MOVED_MODULES, MOVED_NAMES)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from gridgate import core


@pytest.mark.parametrize("old", sorted(core.MOVED_MODULES))
def test_a_moved_module_imports_from_its_old_path_and_says_where_it_went(old: str) -> None:
    name = f"gridgate.core.{old}"
    news = [f"gridgate.core.{target}" for target in core.MOVED_MODULES[old]]
    sys.modules.pop(name, None)
    with pytest.warns(DeprecationWarning, match=news[0].replace(".", r"\.")) as told:
        module = importlib.import_module(name)
    assert all(new in str(told[0].message) for new in news)
    assert "2.0" in str(told[0].message)
    if len(news) == 1:
        assert module is importlib.import_module(news[0])
    else:  # split: each name the old module had comes from one of the new ones
        for new in news:
            for public in getattr(importlib.import_module(new), "__all__", ())[:3]:
                assert getattr(module, public) is getattr(importlib.import_module(new), public)
    sys.modules.pop(name, None)


@pytest.mark.parametrize(
    "module, name",
    sorted((m, n) for m, names in core.MOVED_NAMES.items() for n in names),
)
def test_a_name_that_left_a_public_module_still_comes_from_it(module: str, name: str) -> None:
    target = f"gridgate.core.{core.MOVED_NAMES[module][name]}"
    old = importlib.import_module(f"gridgate.core.{module}")
    with pytest.warns(DeprecationWarning, match=f"{target}.{name}".replace(".", r"\.")):
        value = getattr(old, name)
    assert value is getattr(importlib.import_module(target), name)
    assert name not in vars(old)  # forwarded, not a second copy


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    from gridgate.core import state

    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        state.NoSuchThing  # noqa: B018


def test_out_of_tree_code_written_for_1_4_runs_unchanged_in_a_fresh_interpreter() -> None:
    """What bench/ and site scripts reached for before: the old imports, as written then."""
    code = (
        "import warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n"
        "    from gridgate.core.director import Director\n"
        "except DeprecationWarning as w:\n"
        "    print('told:', w)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "from gridgate.core.director import Director\n"
        "from gridgate.core.state import MemoryState, SqliteState\n"
        "from gridgate.core.state_redis import RedisState\n"
        "from gridgate.core.pilots import Pilot\n"
        "from gridgate.core.tracking import PilotTracker, state_counts\n"
        "from gridgate.core.iteration import Iteration, FailurePath\n"
        "from gridgate.core.engine.director import Director as New\n"
        "assert Director is New\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "told: gridgate.core.director moved to gridgate.core.engine.director" in done.stdout
    assert done.stdout.rstrip().endswith("ok")
