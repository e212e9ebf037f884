"""The limits on what waits have finite defaults (issue 23: DIRAC and Harvester limit waiting
pilots unless told otherwise), ``null`` still means none at every level, and
``max_waiting_cores`` is accepted wherever ``max_waiting`` is."""

from __future__ import annotations

import pytest

from gridgate.core.config import ConfigError
from gridgate.core.engine.limits import (
    DEFAULT_MAX_WAIT_TIME,
    DEFAULT_MAX_WAITING,
    PilotRoom,
    PilotSettings,
)
from gridgate.core.model import BackendInfo, Endpoint, Resources, SubmitRequest
from gridgate.core.testing import make_config


def _settings(pilots: dict) -> PilotSettings:
    config = make_config({"state": {"driver": "memory"}, "director": {"pilots": pilots}})
    return PilotSettings.of(config.director["pilots"])


def test_the_defaults_are_finite_and_as_documented() -> None:
    settings = _settings({})
    assert settings["max_waiting"] == DEFAULT_MAX_WAITING == 20
    assert settings["max_wait_time"] == DEFAULT_MAX_WAIT_TIME == 2 * 86400
    assert settings["max_waiting_cores"] is None and settings["max_total"] is None


def test_null_means_no_limit_at_every_level_and_a_level_not_naming_one_inherits() -> None:
    e1, e2 = Endpoint("b", "e1"), Endpoint("b", "e2")
    settings = _settings(
        {
            "max_waiting": None,
            "backends": {
                "b": {"max_waiting": 5, "endpoints": {"e2": {"max_waiting": None}}},
                "c": {"max_wait_time": None},
            },
        }
    )
    assert settings.for_endpoint(e1, "max_waiting") == 5  # the backend's
    assert settings.for_endpoint(e2, "max_waiting") is None  # its own null: no limit
    assert settings.for_endpoint(Endpoint("x", "e"), "max_waiting") is None  # the director's
    assert settings.for_backend("c", "max_wait_time") is None  # null beats the default
    assert settings.for_backend("b", "max_wait_time") == DEFAULT_MAX_WAIT_TIME


def test_max_waiting_cores_is_accepted_wherever_max_waiting_is() -> None:
    settings = _settings(
        {
            "max_waiting_cores": 64,
            "backends": {
                "b": {"max_waiting_cores": 32, "endpoints": {"e2": {"max_waiting_cores": 8}}}
            },
        }
    )
    assert settings.for_endpoint(Endpoint("b", "e1"), "max_waiting_cores") == 32
    assert settings.for_endpoint(Endpoint("b", "e2"), "max_waiting_cores") == 8
    assert settings.for_endpoint(Endpoint("x", "e"), "max_waiting_cores") == 64
    for bad in (-1, 10_000_001, 2.5, "8"):
        with pytest.raises(ConfigError, match="max_waiting_cores"):
            _settings({"max_waiting_cores": bad})


def test_limits_reserve_by_cores_per_endpoint() -> None:
    e1, e2 = Endpoint("b", "e1"), Endpoint("b", "e2")
    info = BackendInfo("b", (e1, e2))
    settings = _settings({"max_waiting": None, "max_waiting_cores": 16})
    limits = PilotRoom(
        settings, {("b", "e1", "waiting"): 1}, {"b": info}, waiting_cores={"b/e1": 8}
    )
    big = SubmitRequest("b", count=5, resources=Resources(cores=8))
    kept, cuts = limits.trim([big], {"b": (e1, e2)})
    assert [r.count for r in kept] == [3]  # 8 + 16 cores of room: three pilots of 8
    assert [(limit, n) for _r, limit, n in cuts] == [("max_waiting_cores", 2)]
    assert limits.with_room([e1, e2], cores=8) == [e1, e2]
    assert limits.reserve(e1, kept[0]).count == 1  # 8 cores left on e1: one pilot
    assert limits.with_room([e1, e2], cores=8) == [e2]
    assert limits.reserve(e1, kept[0]) is None
    assert limits.reserve(e2, kept[0]).count == 2
    assert limits.with_room([e1, e2]) == []
    # a pilot asking no resources counts one core
    one = PilotRoom(settings, {("b", "e1", "waiting"): 15}, {"b": info})
    kept, _cuts = one.trim([SubmitRequest("b", count=40)], {"b": (e1,)})
    assert [r.count for r in kept] == [1]
