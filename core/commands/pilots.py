"""``gridgate pilots list|summary|cancel``: the pilot registry seen and acted on from another
process than the director (sqlite or Redis state)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from gridgate.core import hookimpl
from gridgate.core.cli import echo
from gridgate.core.commands.report import render_states
from gridgate.core.credential_names import CredentialChoice
from gridgate.core.engine.cancelling import cancel_pilots
from gridgate.core.engine.pilot_credentials import GroupCredentials, configured_kinds, names_for
from gridgate.core.engine.tracking import state_counts
from gridgate.core.model import PILOT_STATES, TERMINAL_STATES, Endpoint
from gridgate.core.state import Pilot, PilotRegistry

if TYPE_CHECKING:
    from gridgate.core.engine.runtime import Runtime


class Commands:
    """gridgate.cli provider of core's pilot commands."""

    @hookimpl
    def gridgate_register_commands(self, cli: click.Group) -> None:
        cli.add_command(pilots_group)


@click.group("pilots")
def pilots_group() -> None:
    """The pilots the director tracks: by endpoint and state, and cancelling them."""


def _registry(path: str) -> tuple[Any, Any]:
    from gridgate.core.commands.servers import open_state_or_exit

    state = open_state_or_exit(path)
    return state, state.pilot_registry()


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))


_filters = [
    click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False)),
    click.option("--backend", help="Only this backend (entry-point name)."),
    click.option("--endpoint", help="Only this endpoint (server, queue or partition name)."),
    click.option(
        "--state",
        "states",
        multiple=True,
        type=click.Choice(PILOT_STATES),
        help="Only pilots in this state (repeatable).",
    ),
]


def with_filters(fn: Any) -> Any:
    for option in reversed(_filters):
        fn = option(fn)
    return fn


@pilots_group.command("list")
@with_filters
@click.option("--limit", type=click.IntRange(min=1), help="At most this many rows.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
def pilots_list(
    path: str,
    backend: str | None,
    endpoint: str | None,
    states: Sequence[str],
    limit: int | None,
    as_json: bool,
) -> None:
    """One row per pilot: job id, endpoint, state, since when, and the backend's own words."""
    state, registry = _registry(path)
    try:
        pilots = registry.query(backend, endpoint, list(states) or None, limit)
    finally:
        state.close()
    if as_json:
        echo(json.dumps({"pilots": [p.as_dict() for p in pilots]}, indent=2))
        return
    if not pilots:
        echo("no pilot matches")
        return
    echo(
        f"{'JOB ID':<40} {'ENDPOINT':<30} {'STATE':<10} {'SUBMITTED (UTC)':<20} "
        f"{'SINCE (UTC)':<20} NATIVE / REASON"
    )
    for p in pilots:
        words = " - ".join(t for t in (p.native, p.reason) if t)
        echo(
            f"{p.job_id:<40} {p.endpoint_key:<30} {p.state:<10} {_utc(p.submitted):<20} "
            f"{_utc(p.changed):<20} {words}"
        )


@pilots_group.command("summary")
@click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
def pilots_summary(path: str, as_json: bool) -> None:
    """Pilots per endpoint and state."""
    state, registry = _registry(path)
    try:
        table = state_counts(registry.counts())
    finally:
        state.close()
    if as_json:
        echo(json.dumps({"endpoints": table}, indent=2))
        return
    echo(render_states(table).removesuffix("\n"))


@pilots_group.command("cancel")
@click.argument("job_ids", nargs=-1)
@with_filters
@click.option(
    "--all", "everything", is_flag=True, help="Every non-terminal pilot that the filters match."
)
@click.option("--json", "as_json", is_flag=True, help="What was cancelled, as JSON.")
def pilots_cancel(
    job_ids: Sequence[str],
    path: str,
    backend: str | None,
    endpoint: str | None,
    states: Sequence[str],
    everything: bool,
    as_json: bool,
) -> None:
    """Cancel JOB_IDS (or, with --all, every live pilot the filters match) on their backends,
    one command per endpoint, under admission control (category other)."""
    from gridgate.core.cli import load_config_or_exit
    from gridgate.core.engine.director import Director

    if not job_ids and not everything:
        raise click.UsageError("name the job ids to cancel, or --all with filters")
    config = load_config_or_exit(path)
    state, registry = _registry(path)
    director = Director(config, state=state, serve_metrics=False)
    try:
        live = [
            p
            for p in registry.query(backend, endpoint, list(states) or None)
            if p.state not in TERMINAL_STATES and (everything or p.job_id in set(job_ids))
        ]
        outcome = cancel(director.runtime, registry, live)
    finally:
        director.close()
        state.close()
    missing = sorted(set(job_ids) - {p.job_id for p in live})
    if as_json:
        echo(json.dumps({**outcome, "not_found": missing}, indent=2))
    else:
        for key, ids in outcome["cancelled"].items():
            echo(f"{key}: cancelled {len(ids)}: {' '.join(ids)}")
        for key, why in outcome["failed"].items():
            echo(f"{key}: NOT cancelled: {why}")
        for job in missing:
            echo(f"{job}: not a live tracked pilot")
    if outcome["failed"]:
        raise SystemExit(1)


def cancel(
    runtime: Runtime, registry: PilotRegistry, pilots: Sequence[Pilot]
) -> dict[str, dict[str, Any]]:
    """Cancel ``pilots`` through the backends' ``gridgate_cancel``, one call per endpoint, and
    record those cancelled; returns ``{"cancelled": {endpoint: ids}, "failed": {endpoint: why}}``.
    ``runtime`` is a director's (``Director.runtime``): its plugins and config."""
    hook = runtime.pm.hook
    by_endpoint: dict[tuple[str, str], list[Pilot]] = {}
    for pilot in pilots:
        by_endpoint.setdefault((pilot.backend, pilot.endpoint), []).append(pilot)
    out: dict[str, dict[str, Any]] = {"cancelled": {}, "failed": {}}
    default_timeout = float(runtime.config.director["command_timeout"])
    choice = CredentialChoice.from_config(runtime.config, configured_kinds(runtime))
    groups = GroupCredentials(runtime)
    for (backend, name), group in sorted(by_endpoint.items()):
        key = f"{backend}/{name}"
        info = hook.gridgate_backend_info(backend=backend)
        if info is None:
            out["failed"][key] = f"backend {backend} is no longer configured"
            continue
        # an endpoint no longer in the config (a retired server or partition) is still the
        # backend's: its pilots are cancelled by job id like any other
        endpoint = next((e for e in info.endpoints if e.name == name), None) or Endpoint(
            backend, name
        )
        timeout = float(info.command_timeout or default_timeout)
        # each pilot with its group's credential, as the director's cancels
        names = names_for(choice, endpoint, info.credentials, groups.of_backend(backend))
        done, problem = cancel_pilots(
            runtime,
            registry,
            endpoint,
            group,
            timeout,
            "cancelled with gridgate pilots cancel",
            names=names,
        )
        if done:
            out["cancelled"][key] = done
        if problem:
            out["failed"][key] = problem
    return out
