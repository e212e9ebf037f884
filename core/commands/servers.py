"""``gridgate servers list|show|ban|drain|unban|clear``: the servers out of rotation (failing
cache, operator bans) and putting them back, read from and written to the director's state store."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from gridgate.core.cli import EXIT_CONFIG, echo, load_config_or_exit
from gridgate.core.documents import DocumentError, decode_json
from gridgate.core.plugins import PluginLoadError
from gridgate.core.text import printable


@click.group("servers")
def servers_group() -> None:
    """Servers out of rotation (failing cache) or watched (tickets window), and putting them back."""


def open_state_or_exit(path: str) -> Any:
    """The state store the config at ``path`` names; exit 1 for one no other process can read."""
    from gridgate.core.state import open_state

    config = load_config_or_exit(path)
    if (config.get("state") or {}).get("driver") == "memory":
        echo(
            f"{path}: state.driver is memory: the caches live inside the running director "
            "only, nothing to show or change from here",
            err=True,
        )
        raise SystemExit(1)
    return open_state(config)


def _utc(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) if ts else "-"


@servers_group.command("list")
@click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
def servers_list(path: str, as_json: bool) -> None:
    """Every server that is not plainly in rotation: not available as the director last saw
    it (from every availability source: operator bans, GOCDB downtimes, pilot efficiency, a
    plugin's), banned or drained by an operator, and what the failing and tickets caches hold;
    read from the director's state store."""
    from gridgate.core.builtin.bans import OperatorBans
    from gridgate.core.engine.availability import unavailable_view
    from gridgate.core.failing import FailingCache
    from gridgate.core.state import StateError

    state = open_state_or_exit(path)
    try:
        rows = FailingCache(state).view(time.time())
        try:
            bans = [entry.as_dict() for entry in OperatorBans(state).entries()]
            checked, unavailable = unavailable_view(state)
            waits_checked, waits = _credential_waits(state)
        except StateError as exc:
            echo(f"{path}: cannot read the state store: {exc}", err=True)
            raise SystemExit(1) from None
    finally:
        state.close()
    if as_json:
        doc: dict[str, Any] = {
            "servers": rows,
            "unavailable": unavailable,
            "availability_checked": checked,
            "bans": bans,
            "credential_waits": waits,
            "credential_waits_checked": waits_checked,
        }
        echo(json.dumps(doc, indent=2))
        return
    if unavailable:
        _echo_unavailable(unavailable, checked)
        echo("")
    if waits:
        _echo_waits(waits, waits_checked)
        echo("")
    if bans:  # before the caches, which print as they always did
        _echo_bans(bans)
        echo("")
    if not rows:
        if unavailable or bans or waits:
            echo("no failure episode is open")
        else:
            echo("every server is in rotation; no failure episode is open")
        return
    echo(
        f"{'SERVER':<44}{'STATUS':<13}{'KIND':<13}{'EPISODE SINCE (UTC)':<21}{'FAILURES':>9}  "
        f"{'OUT UNTIL (UTC)':<21}{'ALARM IF IT FAILS BEFORE (UTC)'}"
    )
    for r in rows:
        echo(
            f"{r['server']:<44}{r['status']:<13}{r['kind'] or '-':<13}{_utc(r['episode_start']):<21}"
            f"{r['failures']:>9}  {_utc(r['failing_until']):<21}{_utc(r['tickets_until'])}"
        )


def _ago(when: float | None) -> str:
    if when is None:
        return "never"
    seconds = max(0.0, time.time() - when)
    return f"{_utc(when)} UTC, {seconds:.0f} s ago"


def _echo_unavailable(rows: list[dict[str, Any]], checked: float | None) -> None:
    echo(f"not available, as the director last saw it ({_ago(checked)}):")
    echo(f"{'ENDPOINT':<44}{'STATE':<10}{'SOURCE':<22}{'SINCE (UTC)':<21}{'UNTIL (UTC)':<21}WHY")
    for row in rows:
        echo(
            f"{row['endpoint']:<44}{row['state']:<10}{row['source'] or '-':<22}"
            f"{_utc(row['since']):<21}{_utc(row['until']):<21}{row['reason']}"
        )


def _credential_waits(state: Any) -> tuple[float | None, dict[str, Any]]:
    """(when the director last checked, {endpoint key: {"endpoint": [names], "groups": {group:
    [names]}}}): the unusable credentials each endpoint and group waits for.

    :raises StateError: the store cannot be read.
    """
    from gridgate.core.engine.credential_episodes import WAITS

    raw = state.get(WAITS)
    if raw is None:
        return None, {}
    record = _record(raw)
    waits = record.get("waits")
    when = record.get("time")
    return (
        float(when) if isinstance(when, (int, float)) else None,
        waits if isinstance(waits, dict) else {},
    )


def _wait_words(wait: Mapping[str, Any]) -> list[str]:
    """``{"endpoint": [...], "groups": {...}}`` as phrases: ``itself for lhcb-proxy``,
    ``group lhcb for lhcb-proxy``."""
    words = []
    if wait.get("endpoint"):
        words.append(f"itself for {', '.join(map(str, wait['endpoint']))}")
    for group, names in sorted((wait.get("groups") or {}).items()):
        words.append(f"group {group} for {', '.join(map(str, names))}")
    return words


def _echo_waits(waits: Mapping[str, Any], checked: float | None) -> None:
    echo(f"waiting for a credential, as the director last saw it ({_ago(checked)}):")
    echo(f"{'ENDPOINT':<44}WAITS")
    for key, wait in sorted(waits.items()):
        echo(f"{key:<44}{'; '.join(_wait_words(wait))}")


@servers_group.command("show")
@click.argument("endpoint")
@click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of text.")
def servers_show(endpoint: str, path: str, as_json: bool) -> None:
    """Why does ENDPOINT get no pilots? Its availability (every source), its place in the
    failing cache, its pilots against the limits, the credentials of its backend, its last
    submission and its last poll, in one screen."""
    from gridgate.core.builtin.bans import BanError, resolve_endpoint

    config = load_config_or_exit(path)
    store = open_state_or_exit(path)
    try:
        try:
            key = resolve_endpoint(endpoint, _known_endpoints(config, store)).key
        except BanError as exc:
            echo(f"gridgate servers show: {exc}", err=True)
            raise SystemExit(EXIT_CONFIG) from None
        doc = _endpoint_view(config, store, key)
    finally:
        store.close()
    if as_json:
        echo(json.dumps(doc, indent=2))
        return
    for line in _render_view(doc):
        echo(line)


def _record(value: str) -> dict[str, Any]:
    """A record another director wrote in the store; one that cannot be read says so
    instead of ending the command with a traceback."""
    try:
        record: dict[str, Any] = decode_json(value, dict[str, Any], kind="state store record")
    except DocumentError as exc:
        return {"message": f"unreadable record in the state store: {exc}"}
    return record


def _endpoint_view(config: Any, store: Any, key: str) -> dict[str, Any]:
    """Everything ``servers show`` says of endpoint ``key``, read from the store."""
    from gridgate.core.builtin.bans import OperatorBans
    from gridgate.core.engine.availability import CHECKED, told_states
    from gridgate.core.engine.credential_episodes import STATUS
    from gridgate.core.engine.limits import PilotSettings
    from gridgate.core.engine.queue_state import KEPT
    from gridgate.core.engine.runtime import ACCOUNTING
    from gridgate.core.engine.tracking import LAST_POLL
    from gridgate.core.failing import FailingCache
    from gridgate.core.model import TERMINAL_STATES, Endpoint
    from gridgate.core.plugins import CONFIG_GROUPS, load_class
    from gridgate.core.state import StateError

    backend, name = key.split("/", 1)
    now = time.time()
    view: dict[str, Any] = {"endpoint": key, "read_at": now}
    try:
        told, since = told_states(store).get(key, (None, 0.0))
        raw = store.get(CHECKED)
        view["availability"] = {
            **(told.as_dict() if told else {"state": "available"}),
            "since": since if told else None,
            "checked": float(raw) if raw else None,
        }
        ban = next((e.as_dict() for e in OperatorBans(store).entries() if e.endpoint == key), None)
        view["ban"] = ban
        view["failing"] = next(
            (r for r in FailingCache(store).view(now) if r["server"] == key), None
        )
        counts = store.pilot_registry().counts()
        waiting = sum(
            n for (b, e, st), n in counts.items() if (b, e, st) == (backend, name, "waiting")
        )
        active = sum(
            n for (b, e, st), n in counts.items() if b == backend and st not in TERMINAL_STATES
        )
        here = sum(
            n
            for (b, e, st), n in counts.items()
            if (b, e) == (backend, name) and st not in TERMINAL_STATES
        )
        settings = PilotSettings.of(config.director.get("pilots") or {})
        endpoint = Endpoint(backend, name)
        view["pilots"] = {
            "waiting": waiting,
            "active_here": here,
            "max_waiting": settings.for_endpoint(endpoint, "max_waiting"),
            "active_backend": active,
            "max_total": settings.for_backend(backend, "max_total"),
            "tracked": bool(settings["track"]),
        }
        try:
            needs = tuple(
                getattr(load_class(CONFIG_GROUPS["backends"], backend), "credentials", ())
            )
        except Exception:  # a backend not built from the config: it says nothing here
            needs = ()
        credentials = {}
        for item_key, value in store.items(STATUS):
            record = _record(value)
            credentials[item_key[len(STATUS) :]] = {**record, "needed": record.get("kind") in needs}
        view["credentials"] = credentials
        checked, waits = _credential_waits(store)
        view["credential_waits"] = {**waits.get(key, {}), "checked": checked}
        last = None
        for record in store.records(ACCOUNTING, now - 7 * 86400):
            if record.get("backend") == backend and record.get("endpoint") == name:
                last = record
        view["last_submission"] = last
        raw_poll = store.get(LAST_POLL + key)
        view["last_poll"] = _record(raw_poll) if raw_poll else None
        raw_queue = store.get(KEPT + backend)
        queues = _record(raw_queue) if raw_queue else {}
        view["queue"] = (
            queues if "message" in queues and key not in queues else queues.get(key) or None
        )
    except StateError as exc:
        echo(f"cannot read the state store: {exc}", err=True)
        raise SystemExit(1) from None
    return view


def _render_view(doc: dict[str, Any]) -> list[str]:
    key = doc["endpoint"]
    lines = [f"{key}"]
    av = doc["availability"]
    if av["state"] == "available":
        lines.append(
            f"  availability: available (as the director last saw it: {_ago(av['checked'])})"
        )
    else:
        until = f" until {_utc(av['until'])} UTC" if av.get("until") else ", no known end"
        lines.append(
            f"  availability: {av['state']}{until}, says {av['source']}: {av['reason']} "
            f"(since {_utc(av['since'])} UTC; seen {_ago(av['checked'])})"
        )
    ban = doc.get("ban")
    if ban:
        lines.append(
            f"  operator: {ban['state']} by {ban['who']} until {_utc(ban['until'])} UTC: {ban['why']}"
        )
    failing = doc.get("failing")
    if failing is None:
        lines.append("  failing cache: not in it (no failure episode open)")
    elif failing["status"] == "failing":
        lines.append(
            f"  failing cache: OUT of rotation until {_utc(failing['failing_until'])} UTC "
            f"({failing['kind']}, {failing['failures']} failure(s) since "
            f"{_utc(failing['episode_start'])} UTC)"
        )
    else:
        lines.append(
            f"  failing cache: {failing['status']} (a failure before "
            f"{_utc(failing['tickets_until'])} UTC raises the alarm)"
        )
    pilots = doc["pilots"]

    def limit(value: Any) -> str:
        return "no limit" if value is None else str(value)

    if pilots["tracked"]:
        lines.append(
            f"  pilots: {pilots['waiting']} waiting here (max_waiting {limit(pilots['max_waiting'])}), "
            f"{pilots['active_backend']} active on the backend (max_total {limit(pilots['max_total'])})"
        )
    else:
        lines.append("  pilots: not tracked (director.pilots.track: false)")
    wait = doc.get("credential_waits") or {}
    words = _wait_words(wait)
    if words:
        lines.append(
            f"  waits for a credential: {'; '.join(words)} (seen {_ago(wait.get('checked'))})"
        )
    if not doc["credentials"]:
        lines.append("  credentials: none checked by a director on this store")
    for name, status in sorted(doc["credentials"].items()):
        need = " (its backend needs its kind)" if status.get("needed") else ""
        state = "usable" if status["usable"] else "UNUSABLE"
        lines.append(
            f"  credential {name}{need}: {state}: {status['message']} (checked {_ago(status['time'])})"
        )
    last = doc.get("last_submission")
    if last is None:
        lines.append("  last submission: none in the last 7 days")
    else:
        what = last["outcome"] + (f" ({last['failure_kind']})" if last.get("failure_kind") else "")
        pilots = last.get("pilots", 0)  # not config: an accounting row, shown as it was written
        lines.append(f"  last submission: {_ago(last['time'])}: {what}, {pilots} pilot(s)")
    lines.append(_queue_line(doc.get("queue")))
    poll = doc.get("last_poll")
    if poll is None:
        lines.append("  last poll: none kept")
    else:
        lines.append(
            f"  last poll: {_ago(poll['time'])}: {poll['outcome']}, {poll['pilots']} pilot(s) asked, "
            f"{poll['changed']} changed"
        )
    return lines


def _queue_line(queue: Mapping[str, Any] | None) -> str:
    """What the endpoint's queue last said of itself (``gridgate_endpoint_state``), kept by a
    director in the store."""
    from gridgate.core.endpoint_state import EndpointState

    if queue is None:
        return "  queue: nothing said (its backend cannot say, or no director asked it lately)"
    if not isinstance(queue, Mapping):
        return "  queue: unreadable record in the state store"
    if "message" in queue and "serving" not in queue:
        return f"  queue: {queue['message']}"
    names = {f.name for f in dataclasses.fields(EndpointState)}
    try:
        state = EndpointState(**{k: v for k, v in queue.items() if k in names})
    except (TypeError, ValueError) as exc:
        return f"  queue: unreadable record in the state store: {exc}"
    limits = [
        f"{label} {value}"
        for label, value in (
            ("max walltime", None if state.max_walltime is None else f"{state.max_walltime} s"),
            ("max memory", None if state.max_memory_mb is None else f"{state.max_memory_mb} MB"),
            ("max cores", state.max_cores),
        )
        if value is not None
    ]
    said = printable(state.describe(), newlines=False)
    source = f", says {printable(state.source, newlines=False)}" if state.source else ""
    asked = queue.get("asked")
    return (
        f"  queue: {said}"
        + (f"; {', '.join(limits)}" if limits else "")
        + f"{source} (asked {_ago(asked if isinstance(asked, (int, float)) else None)})"
    )


def _echo_bans(bans: list[dict[str, Any]]) -> None:
    echo(f"{'BANNED OR DRAINED':<44}{'STATE':<9}{'BY':<13}{'UNTIL (UTC)':<21}WHY")
    for entry in sorted(bans, key=lambda e: str(e["endpoint"])):
        echo(
            f"{entry['endpoint']:<44}{entry['state']:<9}{entry['who']:<13}"
            f"{_utc(entry['until']):<21}{entry['why']}"
        )


def operator(environ: Mapping[str, str] | None = None, uid: int | None = None) -> str:
    """Who runs the command, as a ban records it: the login of the real uid; when the real uid
    is 0 and sudo really ran this command (a ``sudo`` among this process's ancestors),
    ``SUDO_USER`` with it (``alice (sudo, as root)``). ``SUDO_USER`` alone proves nothing: any
    user can set it (``nobody`` with ``SUDO_USER=root`` would ban "by root")."""
    environ = os.environ if environ is None else environ
    uid = os.getuid() if uid is None else uid
    try:
        login = pwd.getpwuid(uid).pw_name
    except KeyError:
        login = f"uid{uid}"
    sudo = environ.get("SUDO_USER", "")
    if uid == 0 and sudo and sudo != login and _under_sudo():
        return f"{sudo} (sudo, as {login})"
    if uid == 0 and sudo == login and _under_sudo():
        return f"{login} (sudo)"
    return login


def _under_sudo() -> bool:
    """Whether a ``sudo`` process is an ancestor of this one (sudo waits for its command)."""
    pid = os.getppid()
    seen: set[int] = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        if raw[raw.index("(") + 1 : raw.rindex(")")] == "sudo":
            return True
        pid = int(raw[raw.rindex(")") + 2 :].split()[1])
    return False


def _known_endpoints(config: Any, state: Any) -> list[Any]:
    """The endpoints an operator may name: every configured backend's (its section's
    endpoint list), and those the director's store knows of (a backend registered in the
    director's process): its pilots, its availability notices, its failing cache."""
    from gridgate.core.engine.availability import told_states
    from gridgate.core.failing import FailingCache
    from gridgate.core.model import Endpoint
    from gridgate.core.plugins import CONFIG_GROUPS, load_class
    from gridgate.core.state import StateError

    found: dict[str, Endpoint] = {}
    for backend, section in (config.get("backends") or {}).items():
        try:
            key = getattr(load_class(CONFIG_GROUPS["backends"], backend), "endpoints_key", None)
        except PluginLoadError:
            continue  # the config loaded, so it did import: nothing to name here
        for name in (section or {}).get(key or "", None) or ():
            endpoint = Endpoint(str(backend), str(name))
            found.setdefault(endpoint.key, endpoint)
    try:
        counts = state.pilot_registry().counts()
    except StateError:
        counts = {}
    keys = [f"{backend}/{name}" for backend, name, _state in counts]
    try:
        keys += list(told_states(state))
        keys += [row["server"] for row in FailingCache(state).view()]
    except StateError:
        pass  # what the store cannot say, the operator names by its backend's config
    for key in keys:
        backend, _, name = key.partition("/")
        if name:
            found.setdefault(key, Endpoint(backend, name))
    return list(found.values())


@contextmanager
def _bans_command(path: str, verb: str) -> Iterator[tuple[Any, Any]]:
    """The config and the open state store for one ``gridgate servers VERB``: a BanError in
    the block is a usage error naming the command (exit 2), a store that cannot be written
    exit 1; the store is closed after."""
    from gridgate.core.builtin.bans import BanError
    from gridgate.core.state import StateError

    config = load_config_or_exit(path)
    store = open_state_or_exit(path)
    try:
        try:
            yield config, store
        except BanError as exc:
            echo(f"gridgate servers {verb}: {exc}", err=True)
            raise SystemExit(EXIT_CONFIG) from None
        except StateError as exc:
            echo(f"{path}: cannot write to the state store: {exc}", err=True)
            raise SystemExit(1) from None
    finally:
        store.close()


def _withdraw(path: str, endpoint: str, state_name: str, duration: str, reason: str) -> None:
    from gridgate.core.builtin.bans import OperatorBans, parse_duration, resolve_endpoint

    with _bans_command(path, _VERB[state_name]) as (config, store):
        seconds = parse_duration(duration)
        key = resolve_endpoint(endpoint, _known_endpoints(config, store)).key
        entry = OperatorBans(store).put(
            key, state_name, who=operator(), why=reason, duration=seconds
        )
    echo(
        f"{entry.endpoint}: {entry.state} until {_utc(entry.until)} UTC by {entry.who}: {entry.why}"
    )


_VERB = {"banned": "ban", "drained": "drain"}
_FOR_HELP = "How long: 30m, 2h, 1d12h (at most 365d); it ends by itself then."
_REASON_HELP = "Why, for the other operators (gridgate servers list shows it)."


def _withdraw_options(command: Any) -> Any:
    """ENDPOINT, -c/--config, --for and --reason: what ban and drain both take."""
    for option in (
        click.option("--reason", required=True, help=_REASON_HELP),
        click.option("--for", "duration", required=True, help=_FOR_HELP),
        click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False)),
        click.argument("endpoint"),
    ):
        command = option(command)
    return command


@servers_group.command("ban")
@_withdraw_options
def servers_ban(endpoint: str, path: str, duration: str, reason: str) -> None:
    """Ban ENDPOINT (backend/name, or a name only one backend has): no new pilots, and its
    pilots not polled when its backend cannot ask it. Kept in the state store, so every
    director on it honours it from its next iteration. Recorded as your login; run by root
    through sudo, as SUDO_USER with it ("alice (sudo, as root)")."""
    _withdraw(path, endpoint, "banned", duration, reason)


@servers_group.command("drain")
@_withdraw_options
def servers_drain(endpoint: str, path: str, duration: str, reason: str) -> None:
    """Drain ENDPOINT: no new pilots; the ones there are still tracked to their end. Kept in
    the state store like a ban (and replaces one)."""
    _withdraw(path, endpoint, "drained", duration, reason)


@servers_group.command("unban")
@click.argument("endpoint")
@click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False))
def servers_unban(endpoint: str, path: str) -> None:
    """Lift the ban or drain of ENDPOINT now (directors use it again from their next
    iteration)."""
    from gridgate.core.builtin.bans import OperatorBans, resolve_endpoint

    with _bans_command(path, "unban") as (config, store):
        key = resolve_endpoint(endpoint, _known_endpoints(config, store)).key
        lifted = OperatorBans(store).unban(key)
    if lifted is None:
        echo(f"{key}: not banned or drained")
    else:
        echo(f"{key}: {lifted.state} by {lifted.who} lifted ({lifted.why})")


@servers_group.command("clear")
@click.argument("servers", nargs=-1)
@click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False))
@click.option("--all", "everything", is_flag=True, help="Every server, and the local-fault notes.")
@click.option("--json", "as_json", is_flag=True, help="What was cleared, as JSON.")
def servers_clear(servers: tuple[str, ...], path: str, everything: bool, as_json: bool) -> None:
    """Put SERVERS (host names or backend/host) back in rotation now, as if they had never failed.

    For a server the site has fixed: the director uses it from its next iteration, and its next
    failure starts a new episode (an error mail, not an alarm). When it answers again, a notice
    says it works again, cleared by whom."""
    from gridgate.core.failing import FailingCache

    if not servers and not everything:
        raise click.UsageError("name at least one server, or --all")
    state = open_state_or_exit(path)
    try:
        cleared = FailingCache(state).clear(list(servers), everything=everything, who=operator())
    finally:
        state.close()
    missing = sorted(
        n for n in servers if not any(c == n or c.split("/", 1)[-1] == n for c in cleared)
    )
    if as_json:
        echo(json.dumps({"cleared": cleared, "not_found": missing}))
    else:
        for key in cleared:
            echo(f"cleared {key}")
        for name in missing:
            echo(f"{name}: not in the caches (already in rotation)")
