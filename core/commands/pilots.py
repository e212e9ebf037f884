"""``gridgate pilots list|summary|show|output|cancel``: the pilot registry seen and acted on
from another process than the director (sqlite or Redis state)."""

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
from gridgate.core.engine.output import (
    DEFAULT_CAP,
    MAX_CAP,
    file_name_problem,
    read_output,
)
from gridgate.core.engine.pilot_credentials import GroupCredentials, configured_kinds, names_for
from gridgate.core.engine.tracking import state_counts
from gridgate.core.model import PILOT_STATES, TERMINAL_STATES, Endpoint, OutputStream, PilotOutput
from gridgate.core.state import Pilot, PilotRegistry
from gridgate.core.text import printable

if TYPE_CHECKING:
    from gridgate.core.engine.runtime import Runtime


class Commands:
    """gridgate.cli provider of core's pilot commands."""

    @hookimpl
    def gridgate_register_commands(self, cli: click.Group) -> None:
        cli.add_command(pilots_group)


@click.group("pilots")
def pilots_group() -> None:
    """The pilots the director tracks: by endpoint and state, their output, cancelling them."""


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


#: ``gridgate pilots output``'s exit code when the CE no longer holds the job or its file.
GONE = 3


def _one_pilot(path: str, job_id: str, backend: str | None, endpoint: str | None) -> Pilot:
    """The tracked pilot ``job_id`` (of ``backend``/``endpoint`` when given); exits 1 with a
    message when no pilot or more than one matches."""
    state, registry = _registry(path)
    try:
        found = [p for p in registry.query(backend, endpoint) if p.job_id == job_id]
    finally:
        state.close()
    if not found:
        echo(f"{job_id}: not a tracked pilot (gridgate pilots list shows them)", err=True)
        raise SystemExit(1)
    if len(found) > 1:
        keys = ", ".join(p.endpoint_key for p in found)
        echo(f"{job_id}: tracked on {keys}: say which with --backend and --endpoint", err=True)
        raise SystemExit(1)
    return found[0]


def _read(
    path: str, pilot: Pilot, asks: Sequence[tuple[OutputStream, str]], **kw: Any
) -> list[PilotOutput]:
    """Each of ``asks`` ((stream, file name)) of ``pilot`` read with ``read_output(**kw)``,
    through a director built from the config at ``path`` (its plugins, admission, credentials)."""
    from gridgate.core.cli import load_config_or_exit
    from gridgate.core.engine.director import Director

    config = load_config_or_exit(path)
    state, _unused = _registry(path)
    director = Director(config, state=state, serve_metrics=False)
    try:
        return [read_output(director.runtime, pilot, s, name=n, **kw) for s, n in asks]
    finally:
        director.close()
        state.close()


def _output_json(pilot: Pilot, out: PilotOutput, cap: int) -> dict[str, Any]:
    return {
        "job_id": pilot.job_id,
        "backend": pilot.backend,
        "endpoint": pilot.endpoint,
        "stream": out.stream,
        "name": out.name,
        "ok": out.ok,
        "held": out.held,
        "where": printable(out.where, newlines=False),
        "size": out.size,
        "cap": cap,
        "cut": out.cut,
        "from_end": out.from_end,
        "text": printable(out.text),
        "message": printable(out.message, newlines=False),
    }


def _state_of(out: PilotOutput) -> str:
    """Where a stream is and whether it is still there, in one line."""
    where = out.where or "(where unknown)"
    if not out.ok:
        return f"{where}: not known: {out.message}"
    if not out.held:
        return f"{where}: no longer there: {out.message}"
    size = "" if out.size is None else f" ({out.size} bytes)"
    said = f"; {printable(out.message, newlines=False)}" if out.message else ""
    return f"{where}: still there{size}{said}"


@pilots_group.command("show")
@click.argument("job_id")
@click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False))
@click.option("--backend", help="The pilot's backend, when a job id is tracked twice.")
@click.option("--endpoint", help="The pilot's endpoint, when a job id is tracked twice.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of lines.")
def pilots_show(
    job_id: str, path: str, backend: str | None, endpoint: str | None, as_json: bool
) -> None:
    """One tracked pilot: its record, and where its stdout and stderr are and whether its CE
    still holds them (asked of the backend without reading them, under a query token)."""
    pilot = _one_pilot(path, job_id, backend, endpoint)
    outputs = _read(path, pilot, [("stdout", ""), ("stderr", "")], cap=0)
    if as_json:
        record = pilot.as_dict()
        record["output"] = {o.stream: _output_json(pilot, o, 0) for o in outputs}
        for o in record["output"].values():
            for key in ("text", "cut", "cap", "from_end", "job_id", "backend", "endpoint"):
                del o[key]
        echo(json.dumps(record, indent=2))
        return
    words = " - ".join(t for t in (pilot.native, pilot.reason) if t)
    echo(f"job id:    {pilot.job_id}")
    echo(f"endpoint:  {pilot.endpoint_key} (group {pilot.group}, {pilot.cores} cores)")
    echo(
        f"state:     {pilot.state} since {_utc(pilot.changed)} UTC"
        + (f": {words}" if words else "")
    )
    echo(f"submitted: {_utc(pilot.submitted)} UTC")
    for out in outputs:
        echo(f"{out.stream + ':':<10} {printable(_state_of(out), newlines=False)}")


@pilots_group.command("output")
@click.argument("job_id")
@click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False))
@click.option("--stdout", "stdout", is_flag=True, help="The pilot's stdout (the default).")
@click.option("--stderr", "stderr", is_flag=True, help="The pilot's stderr.")
@click.option("--file", "file_name", metavar="NAME", help="A file of the job's own folder.")
@click.option("--tail", type=click.IntRange(min=1), metavar="N", help="Only the last N lines.")
@click.option(
    "--max-bytes",
    "cap",
    type=click.IntRange(min=1, max=MAX_CAP),
    default=DEFAULT_CAP,
    show_default=True,
    help="Read at most this many bytes (the start, or the end with --tail).",
)
@click.option("--backend", help="The pilot's backend, when a job id is tracked twice.")
@click.option("--endpoint", help="The pilot's endpoint, when a job id is tracked twice.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of the text.")
def pilots_output(
    job_id: str,
    path: str,
    stdout: bool,
    stderr: bool,
    file_name: str | None,
    tail: int | None,
    cap: int,
    backend: str | None,
    endpoint: str | None,
    as_json: bool,
) -> None:
    """Print a tracked pilot's stdout, stderr or a file of its job, read from its CE under a
    query token, cut at --max-bytes and escaped. Exit 1 when it cannot be read, 3 when the CE
    no longer holds the job or the file."""
    if stdout + stderr + (file_name is not None) > 1:
        raise click.UsageError("--stdout, --stderr and --file name three streams: give one")
    if file_name is not None:
        problem = file_name_problem(file_name)
        if problem is not None:
            raise click.BadParameter(problem, param_hint="--file")
    chosen: OutputStream = "file" if file_name is not None else "stderr" if stderr else "stdout"
    pilot = _one_pilot(path, job_id, backend, endpoint)
    (out,) = _read(path, pilot, [(chosen, file_name or "")], cap=cap, tail=tail)
    if as_json:
        echo(json.dumps(_output_json(pilot, out, cap), indent=2))
    else:
        _print_output(out, cap)
    if not out.ok:
        raise SystemExit(1)
    if not out.held:
        raise SystemExit(GONE)


def _print_output(out: PilotOutput, cap: int) -> None:
    """The text on stdout with a mark where it was cut; why nothing came, on stderr."""
    what = out.name or out.stream
    if not out.ok:
        echo(f"{out.job_id}: its {what} could not be read: {out.message}", err=True)
        return
    if not out.held:
        echo(f"{out.job_id}: {out.message or 'the CE no longer holds it'}", err=True)
        return
    text = printable(out.text)
    of = "" if out.size is None else f" of {out.size}"
    if out.cut and out.from_end:
        click.echo(f"[cut at {cap} bytes{of}: its end follows]")
    click.echo(text, nl=bool(text) and not text.endswith("\n"))
    if out.cut and not out.from_end:
        click.echo(f"[cut at {cap} bytes{of}: its start is above]")
    if out.message:  # what the backend adds (a kept copy, where stderr went)
        echo(f"{out.job_id}: {printable(out.message, newlines=False)}", err=True)


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
