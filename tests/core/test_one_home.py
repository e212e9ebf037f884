"""Each public name has one home, the module that defines it: no two public modules export it.
A public module that used to export another's name still gives it, until 2.0, with a
DeprecationWarning naming the home (gridgate.core._moved.SECOND_HOMES)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from gridgate.core._moved import SECOND_HOMES
from gridgate.core.devkit import refdocs


def test_no_two_public_modules_export_one_name() -> None:
    homes: dict[str, list[str]] = {}
    for module, _purpose, names in refdocs.api_names():
        for name in names:
            homes.setdefault(name, []).append(module)
    twice = {name: modules for name, modules in homes.items() if len(modules) > 1}
    assert twice == {}, "a name exported by two public modules (keep it in its home only)"


@pytest.mark.parametrize(
    "module, name",
    sorted((module, name) for module, names in SECOND_HOMES.items() for name in names),
)
def test_a_name_from_its_second_home_comes_from_its_home_with_a_warning(
    module: str, name: str
) -> None:
    home = importlib.import_module(f"gridgate.core.{SECOND_HOMES[module][name]}")
    old = importlib.import_module(f"gridgate.core.{module}")
    assert name in home.__all__  # the home exports it
    assert name not in old.__all__ and name not in vars(old)  # forwarded, not a second copy
    told = rf"gridgate\.core\.{module}\.{name}: import {name} from {home.__name__}, its one home"
    with pytest.warns(DeprecationWarning, match=told) as caught:
        value = getattr(old, name)
    assert value is getattr(home, name)
    assert "2.0" in str(caught[0].message)


def test_an_unknown_name_of_a_forwarding_module_is_still_an_attribute_error() -> None:
    from gridgate.core import failing, testing

    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        failing.NoSuchThing  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        testing.NoSuchThing  # noqa: B018


def test_the_old_imports_run_in_a_fresh_interpreter_and_the_warning_points_at_them() -> None:
    code = (
        "import warnings\n"
        "warnings.simplefilter('always', DeprecationWarning)\n"
        "from gridgate.core.config import SECRET_SCHEMA, SecretError, read_secret\n"
        "from gridgate.core.testing import FakeClock\n"
        "from gridgate.core.failing import Episode\n"
        "from gridgate.core import clock, model, secrets\n"
        "assert (SECRET_SCHEMA, SecretError, read_secret) == "
        "(secrets.SECRET_SCHEMA, secrets.SecretError, secrets.read_secret)\n"
        "assert FakeClock is clock.FakeClock and Episode is model.Episode\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"
    warned = [line for line in done.stderr.splitlines() if "DeprecationWarning" in line]
    assert len(warned) == 5, done.stderr
    # each warning names the line of the old import, not gridgate's forwarding code
    lines = sorted({line.split(":")[1] for line in warned})
    assert lines == ["3", "4", "5"], done.stderr
