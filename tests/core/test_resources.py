"""What a pilot asks of its slot and what a backend can say (issue 23): a backend declares the
resources it maps (``expresses``, ``expresses_tags``: ``BackendInfo.resources``,
``resource_tags``); a demand group asking more is one config error naming the group, the
values and the backend; a request that reaches a backend anyway is refused, never submitted
without them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from gridgate.core.backend import Backend, resource_gaps
from gridgate.core.config import ConfigError, load_config
from gridgate.core.engine.config_checks import reference_problems, resource_problems
from gridgate.core.model import Endpoint, Resources, SubmitRequest, SubmitResult
from gridgate.core.testing import build_plugin
from gridgate.plugins.arc.backend import ArcBackend
from gridgate.plugins.slurm.backend import SlurmBackend


class Plain(Backend):
    """A backend that maps nothing: what a third-party one written before issue 23 is."""

    name = "plain"
    endpoints_key = "queues"
    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"queues": {"type": "array", "items": {"type": "string"}}},
    }

    def __init__(self, config: Mapping[str, Any], context: Any) -> None:
        super().__init__(config, context)
        self.asked: list[SubmitRequest] = []

    def submit(self, endpoint: Endpoint, request: SubmitRequest, timeout: float) -> SubmitResult:
        self.asked.append(request)
        return SubmitResult(endpoint, ok=True, job_ids=("1",))


class Cores(Plain):
    name = "cores"
    expresses = ("cores",)


CLASSES = {("backends", "slurm"): SlurmBackend, ("backends", "plain"): Plain}


def _doc(backend: str, resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "backends": {backend: {"queues": ["q"], "partitions": ["q"]}},
        "demand": {"queue": {"groups": {"mc": {"backend": backend, "resources": resources}}}},
    }


def test_the_defaults_need_no_mapping() -> None:
    assert resource_gaps(None, ()) == []
    assert resource_gaps(Resources(), ()) == []
    assert resource_gaps(Resources(cores=1), ()) == []


def test_each_value_not_mapped_is_named_with_what_was_asked() -> None:
    asked = Resources(cores=8, memory_mb=16000, walltime=3600, tags={"gpu": "a100"})
    assert resource_gaps(asked, ()) == [
        "cores=8",
        "memory_mb=16000",
        "walltime=3600",
        "tags.gpu=a100",
    ]
    assert resource_gaps(asked, ("cores", "walltime"), ("gpu",)) == ["memory_mb=16000"]


def test_a_group_asking_what_its_backend_cannot_say_is_one_error_naming_all() -> None:
    doc = _doc("plain", {"cores": 4, "memory_mb": 8000})
    [(path, message)] = resource_problems(doc, CLASSES)
    assert path == ("demand", "queue", "groups", "mc", "resources", "cores")
    assert message == (
        "group 'mc' asks cores=4, memory_mb=8000, which backend 'plain' cannot express "
        "(it maps nothing but one core; no tag)"
    )
    # and it is among the errors of every load
    assert (path, message) in reference_problems(doc, CLASSES)


def test_a_tag_the_backend_does_not_map_is_an_error_at_the_tag() -> None:
    doc = _doc("slurm", {"cores": 2, "tags": {"constraint": "ib", "gpu": "a100"}})
    [(path, message)] = resource_problems(doc, CLASSES)
    assert path == ("demand", "queue", "groups", "mc", "resources", "tags", "gpu")
    assert "asks tags.gpu=a100, which backend 'slurm' cannot express" in message
    assert "(it maps cores, memory_mb, walltime; tags constraint, gres)" in message


def test_what_a_backend_maps_passes() -> None:
    doc = _doc("slurm", {"cores": 8, "memory_mb": 16000, "walltime": 172800})
    assert resource_problems(doc, CLASSES) == []
    assert resource_problems(_doc("plain", {"cores": 1}), CLASSES) == []


def test_the_static_list_form_is_checked_too() -> None:
    doc = {
        "backends": {"plain": {"queues": ["q"]}},
        "demand": {
            "static": {"plain": [{"group": "big", "pilots": 1, "resources": {"walltime": 60}}]}
        },
    }
    [(path, message)] = resource_problems(doc, CLASSES)
    assert path == ("demand", "static", "plain", 0, "resources", "walltime")
    assert message.startswith("group 'big' asks walltime=60, which backend 'plain'")


def test_a_backend_not_built_from_the_config_is_left_to_its_base_class() -> None:
    assert resource_problems(_doc("elsewhere", {"cores": 64}), CLASSES) == []


def test_backend_info_says_what_the_class_declares() -> None:
    assert build_plugin(Plain, {"queues": ["q"]}).backend_info().resources == ()
    info = build_plugin(Cores, {"queues": ["q"]}).backend_info()
    assert info.resources == ("cores",) and info.resource_tags == ()
    slurm = build_plugin(SlurmBackend, {"partitions": ["p"], "script": "/p.sh"}).backend_info()
    assert slurm.resource_tags == ("constraint", "gres")
    arc = build_plugin(ArcBackend, {"endpoints": ["https://ce.example.org/arex"], "script": "/p"})
    assert arc.backend_info().resources == ("cores", "memory_mb", "walltime")


@pytest.mark.parametrize(
    ("resources", "submitted"),
    [
        (None, True),
        (Resources(cores=4), True),
        (Resources(cores=4, memory_mb=100), False),
        (Resources(tags={"gpu": "a100"}), False),
    ],
)
def test_a_request_the_backend_cannot_express_is_refused_not_submitted_without(
    resources: Resources | None, submitted: bool
) -> None:
    backend = build_plugin(Cores, {"queues": ["q"]})
    request = SubmitRequest("cores", group="mc", resources=resources)
    result = backend.gridgate_submit(endpoint=Endpoint("cores", "q"), request=request, timeout=5)
    assert result is not None and result.ok is submitted
    assert backend.asked == ([request] if submitted else [])
    if not submitted:
        assert result.local_fault == result.message
        assert result.message.startswith("group 'mc' asks ")
        assert "which backend 'cores' cannot express: nothing submitted" in result.message


SITE = """\
backends:
  {backend}:
    {servers}
demand:
  queue:
    groups:
      mc:
        backend: {backend}
        source: {{redis: {{url: "redis://127.0.0.1:6379/0", key: "tq:mc"}}}}
        resources: {resources}
"""


@pytest.mark.parametrize(
    ("backend", "servers", "resources", "line", "message"),
    [
        (
            "slurm",
            "partitions: [debug]\n    script: /p.sh",
            "{cores: 8, memory_mb: 16000, walltime: 172800, tags: {gpu: a100}}",
            11,
            "demand.queue.groups.mc.resources.tags.gpu: group 'mc' asks tags.gpu=a100, which "
            "backend 'slurm' cannot express (it maps cores, memory_mb, walltime; tags "
            "constraint, gres)",
        ),
        (
            "lsf",
            "queues: [normal]",
            "{cores: 2, tags: {constraint: ib}}",
            10,
            "demand.queue.groups.mc.resources.tags.constraint: group 'mc' asks "
            "tags.constraint=ib, which backend 'lsf' cannot express (it maps cores, "
            "memory_mb, walltime; no tag)",
        ),
    ],
)
def test_loading_a_site_config_names_the_group_value_and_backend_at_its_line(
    tmp_path, backend: str, servers: str, resources: str, line: int, message: str
) -> None:
    path = tmp_path / "site.yaml"
    text = SITE.format(backend=backend, servers=servers, resources=resources)
    with pytest.raises(ConfigError) as caught:
        load_config(path, text=text)
    assert [str(p) for p in caught.value.problems] == [f"{path}:{line}: {message}"]


def test_a_site_config_asking_what_its_backend_maps_loads(tmp_path) -> None:
    text = SITE.format(
        backend="slurm",
        servers="partitions: [debug]\n    script: /p.sh",
        resources="{cores: 8, memory_mb: 16000, walltime: 172800, tags: {constraint: ib}}",
    )
    config = load_config(tmp_path / "site.yaml", text=text)
    assert config.get("demand")["queue"]["groups"]["mc"]["resources"]["cores"] == 8


def test_a_static_group_hands_its_resources_to_the_backend(tmp_path) -> None:
    """A site that had --time in sbatch_options (refused since the backend writes it) moves it
    to its static group's resources: the config loads and the request carries them."""
    from gridgate.core.builtin.demand import register_demand
    from gridgate.core.model import DemandRegistry

    text = (
        "backends:\n  slurm:\n    partitions: [debug]\n    script: /p.sh\n"
        "demand:\n  static:\n    slurm:\n"
        "      - {group: long, pilots: 2, resources: {cores: 4, walltime: 7200}}\n"
        "      - {group: plain, pilots: 1}\n"
    )
    config = load_config(tmp_path / "site.yaml", text=text)
    demand = DemandRegistry()
    assert register_demand(config.get("demand")["static"], demand) == 3
    by_group = {r.group: r.resources for r in demand.requests}
    assert by_group["long"] == Resources(cores=4, walltime=7200)
    assert by_group["plain"] in (None, Resources())  # the defaults: nothing to map
