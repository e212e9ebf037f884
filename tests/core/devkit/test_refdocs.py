"""docs/kinds.md, docs/hooks.md and docs/api.md are generated from the code: they fail here
when stale, and every public name has its entry."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from gridgate.core.devkit import refdocs

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", sorted(refdocs.RENDERERS))
def test_generated_reference_is_up_to_date(name: str) -> None:
    current = (ROOT / "docs" / name).read_text(encoding="utf-8")
    assert current == refdocs.RENDERERS[name](), (
        f"docs/{name} is stale; regenerate with: {refdocs.REGENERATE}"
    )


def test_kinds_md_lists_every_catalogued_kind() -> None:
    from gridgate.core.kinds import KINDS

    text = refdocs.render_kinds()
    for kind in KINDS.values():
        assert f"| `{kind.name}` |" in text and kind.meaning in text


# --- every public name has its entry ----------------------------------------------------------


@pytest.mark.parametrize("spec", refdocs.hookspecs(), ids=lambda fn: fn.__name__)
def test_every_hook_documents_each_parameter_and_its_return(spec) -> None:
    doc = refdocs.parse_doc(spec)
    missing = [name for name in inspect.signature(spec).parameters if not doc.params.get(name)]
    assert not missing, f"{spec.__name__}: no ':param NAME:' for {missing}"
    assert doc.returns, f"{spec.__name__}: no ':return:' saying what None means"
    assert f"## {spec.__name__}" in (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")


def _defined_in(module) -> set[str]:
    return {
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", "") == module.__name__
    }


def test_every_value_in_model_and_every_helper_in_the_testing_kit_is_public() -> None:
    from gridgate.core import model, testing

    assert _defined_in(model) <= set(model.__all__), (
        "add the new value to gridgate.core.model.__all__"
    )
    fixtures = {name for name in _defined_in(testing) if name.startswith("gridgate_")}
    assert _defined_in(testing) - fixtures <= set(testing.__all__), (
        "add it to gridgate.core.testing.__all__"
    )


@pytest.mark.filterwarnings("ignore:.*in gridgate's API 1.5:DeprecationWarning")  # X509Proxy
def test_every_public_name_has_an_entry_in_api_md() -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    for module_name, _, names in refdocs.api_names():
        module = importlib.import_module(module_name)
        assert f"## `{module_name}`" in text
        for name in names:
            assert hasattr(module, name), f"{module_name}.{name} is listed but does not exist"
            if module_name == "gridgate.core.hookspecs":  # each documented in hooks.md
                assert f"](hooks.md#{name})" in text
                continue
            assert f"`from {module_name} import {name}`" in text, (
                f"{module_name}.{name} has no entry"
            )


@pytest.mark.filterwarnings("ignore:.*in gridgate's API 1.5:DeprecationWarning")  # X509Proxy
def test_every_parameter_of_a_public_function_is_explained() -> None:
    for module_name, _, names in refdocs.api_names():
        module = importlib.import_module(module_name)
        for name in names:
            obj = getattr(module, name)
            if not inspect.isfunction(obj):
                continue
            doc = refdocs.parse_doc(obj)
            prose = "\n".join(doc.prose)
            for parameter in inspect.signature(obj).parameters:
                assert parameter in doc.params or f"`{parameter}`" in prose, (
                    f"{module_name}.{name}: parameter {parameter!r} is not explained in its docstring"
                )


def test_runner_run_documents_its_keyword_arguments() -> None:
    from gridgate.core.runner import run

    params = refdocs.parse_doc(run).params
    assert {"env", "cwd", "input", "max_output", "kill_grace"} <= set(params)
    assert "max_output_bytes" in params["max_output"]


# --- the API's version follows its fingerprint ------------------------------------------------


def test_the_hookspecs_and_values_match_the_fingerprint_recorded_for_this_api_version() -> None:
    from gridgate.core import API_VERSION

    recorded = refdocs.recorded_fingerprints()
    assert API_VERSION in recorded, (
        f"API {API_VERSION} has no recorded fingerprint: run gridgate docs --fingerprint"
    )
    assert recorded[API_VERSION] == refdocs.api_fingerprint(), (
        "a hookspec or a value crossing hooks changed while gridgate.core.API_VERSION stayed "
        f"{API_VERSION}: raise it (docs/api.md, 'Versions and deprecation'), then run "
        "gridgate docs --fingerprint"
    )


def test_a_changed_hookspec_changes_the_fingerprint_and_cannot_be_recorded_under_the_old_version(
    tmp_path: Path, monkeypatch
) -> None:
    from gridgate.core import API_VERSION, hookspecs

    major, minor = API_VERSION.split(".")
    following = f"{major}.{int(minor) + 1}"
    before = refdocs.api_fingerprint()
    path = tmp_path / "fingerprint.txt"
    assert refdocs.record_fingerprint(path) == before

    def gridgate_submit(endpoint, request, timeout, extra):  # one parameter more
        """changed"""

    gridgate_submit.gridgate_spec = hookspecs.gridgate_submit.gridgate_spec
    gridgate_submit.__code__ = gridgate_submit.__code__.replace(
        co_firstlineno=hookspecs.gridgate_submit.__code__.co_firstlineno
    )
    monkeypatch.setattr(hookspecs, "gridgate_submit", gridgate_submit)
    assert refdocs.api_fingerprint() != before
    with pytest.raises(SystemExit, match="raise gridgate.core.API_VERSION"):
        refdocs.record_fingerprint(path)
    monkeypatch.setattr("gridgate.core.API_VERSION", following)
    assert refdocs.record_fingerprint(path) == refdocs.api_fingerprint()
    assert set(refdocs.recorded_fingerprints(path)) == {API_VERSION, following}
