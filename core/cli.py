"""The ``gridgate`` command line; the only place where log sinks are configured."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from loguru import logger

from gridgate.core import __version__
from gridgate.core.config import ConfigError, compose_schema, load_config
from gridgate.core.logs import configure_logging
from gridgate.core.plugins import PluginLoadError, cli_plugin_manager, installed_plugins

#: Exit code for a config that cannot be used (file, line and key are printed).
EXIT_CONFIG = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gridgate")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.option("--log-json", is_flag=True, help="Structured JSON logs on stderr.")
def cli(verbose: int, log_json: bool) -> None:
    """gridgate keeps grid and batch submission flowing when the services behind it misbehave."""
    configure_logging(verbose, log_json)


def load_config_or_exit(path: str) -> Any:
    """Load the config file at ``path`` for a command; on failure print every problem
    (``FILE:LINE: key: message``) on stderr and exit 2."""
    try:
        return load_config(path)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(str(problem), err=True)
        raise SystemExit(EXIT_CONFIG) from None


@cli.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
@click.option(
    "--kinds", is_flag=True, help="The catalogue of failure kinds instead of the plugins."
)
def plugins_command(as_json: bool, kinds: bool) -> None:
    """List every installed plugin per entry-point group."""
    if kinds:
        from gridgate.core.kinds import print_kinds

        print_kinds(click.echo, as_json)
        return
    rows = installed_plugins()
    if as_json:
        groups: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            groups.setdefault(row.group, []).append(
                {
                    "name": row.name,
                    "target": row.target,
                    "distribution": row.distribution,
                    "version": row.version,
                    "default": row.default,
                }
            )
        click.echo(json.dumps(groups, indent=2))
        return
    current = None
    for row in rows:
        if row.group != current:
            current = row.group
            click.echo(f"{row.group}:")
        mark = " (default)" if row.default else ""
        click.echo(f"  {row.name:<14} {row.distribution} {row.version}  {row.target}{mark}")


@cli.group("plugin")
def plugin_group() -> None:
    """Start a plugin package of your own."""


@plugin_group.command("new")
@click.option("--kind", type=click.Choice(["backend", "notifier", "classifier"]), required=True)
@click.option(
    "--shape",
    type=click.Choice(["command", "batch"]),
    default="command",
    show_default=True,
    help="A backend's shape: one submit command, or submit, status and cancel commands "
    "with a stand-in batch system whose jobs have lifecycles.",
)
@click.argument("name")
@click.argument("folder", required=False, type=click.Path(file_okay=False))
def plugin_new(kind: str, shape: str, name: str, folder: str | None) -> None:
    """Write a package for plugin NAME in FOLDER (default ./gridgate-NAME): entry point,
    schema'd config, tests with the testing kit; `pip install -e` it into a venv of its own
    and its tests pass."""
    from pathlib import Path

    from gridgate.core.scaffold import ScaffoldError, new_plugin, next_steps

    try:
        written = new_plugin(kind, name, Path(folder) if folder else None, shape=shape)
    except ScaffoldError as exc:
        click.echo(f"gridgate plugin new: {exc}", err=True)
        raise SystemExit(EXIT_CONFIG) from None
    root = written[0].parent
    steps = next_steps(kind, root, shape)
    click.echo(f"wrote {len(written)} files in {root}; next:\n{steps}", nl=False)


@cli.group("config")
def config_group() -> None:
    """Validate a config, print its schema or an example."""


@config_group.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def config_validate(files: tuple[str, ...]) -> None:
    """Check config FILES; exit 0 when all are valid, 2 otherwise.

    A file with a director, backends or demand section must also leave something to submit
    (or say director.paused: true). Warnings (legal, probably not meant) do not fail."""
    from gridgate.core.config_checks import checked_config, config_warnings

    bad = False
    for path in files:
        try:
            config = checked_config(path)
        except ConfigError as exc:
            bad = True
            for problem in exc.problems:
                click.echo(str(problem), err=True)
        else:
            for warning in config_warnings(config):
                click.echo(str(warning), err=True)
            click.echo(f"{path}: valid")
    if bad:
        raise SystemExit(EXIT_CONFIG)


@config_group.command("schema")
@click.option(
    "-c",
    "--config",
    "path",
    type=click.Path(dir_okay=False),
    help="Include the sections of the plugins this config names.",
)
def config_schema(path: str | None) -> None:
    """Print the composed JSON Schema (2020-12); editors can use it."""
    doc: Any = {}
    if path:
        import yaml

        with open(path, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle) or {}
    schema, _classes, problems = compose_schema(doc)
    for where, message in problems:
        click.echo(f"{path}: {'.'.join(map(str, where))}: {message}", err=True)
    click.echo(json.dumps(schema, indent=2))
    if problems:
        raise SystemExit(EXIT_CONFIG)


@config_group.command("example")
def config_example() -> None:
    """Print a complete, commented site config that validates."""
    from importlib.resources import files

    click.echo(
        files("gridgate.core").joinpath("example.yaml").read_text(encoding="utf-8"), nl=False
    )


@config_group.command("docs")
@click.option(
    "--all", "everything", is_flag=True, help="Include plugins of other distributions too."
)
def config_docs(everything: bool) -> None:
    """Print the configuration reference (Markdown) generated from the composed schema."""
    from gridgate.core.docgen import render

    click.echo(render(all_distributions=everything), nl=False)


@cli.command("run")
@click.option(
    "-c",
    "--config",
    "path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Site config (re-read at every iteration).",
)
@click.option("--once", is_flag=True, help="One iteration, then exit.")
@click.option("--iterations", type=click.IntRange(min=1), help="This many iterations, then exit.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per iteration on stdout.")
def run_command(path: str, once: bool, iterations: int | None, as_json: bool) -> None:
    """Run the submission director."""
    import signal

    from gridgate.core.config import ConfigSource
    from gridgate.core.config_checks import submission_problems
    from gridgate.core.director import Director, summary_json

    config = load_config_or_exit(path)
    idle = submission_problems(config)
    for problem in idle:
        click.echo(str(problem), err=True)
    if idle:
        raise SystemExit(EXIT_CONFIG)
    director = Director(ConfigSource(path, initial=config))

    def stop(signum: int, _frame: Any) -> None:
        logger.warning("signal {} received: finishing the commands in flight", signum)
        director.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def emit(summary: Any) -> None:
        if as_json:
            click.echo(summary_json(summary))
        else:
            counts: dict[str, int] = {}
            for record in summary.records:
                counts[record.outcome] = counts.get(record.outcome, 0) + record.pilots
            click.echo(
                f"iteration {summary.number}: {summary.duration:.1f} s, "
                + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                + (f", excluded {', '.join(summary.excluded)}" if summary.excluded else "")
            )

    try:
        director.run(iterations=1 if once else iterations, on_iteration=emit)
    finally:
        director.close()


@cli.command("report")
@click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False))
@click.option("--since", default="24h", show_default=True, help="How far back: 90m, 24h, 7d.")
@click.option("--json", "as_json", is_flag=True, help="Rows as JSON.")
@click.option("--bucket", default="1h", show_default=True, help="Width of a row/bar: 1h, 10m, 30s.")
@click.option(
    "--png", "png", type=click.Path(dir_okay=False), help="Also draw the plot to this PNG."
)
def report_command(path: str, since: str, bucket: str, as_json: bool, png: str | None) -> None:
    """Pilots per hour per endpoint, from the accounting and failures tables and the pilots."""
    from gridgate.core.director import open_state
    from gridgate.core.report import parse_duration, plot_unavailable, read_report, render_table

    config = load_config_or_exit(path)
    try:
        seconds = parse_duration(since)
        width = parse_duration(bucket)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if width <= 0:
        raise click.BadParameter("--bucket must be positive")
    if png and (problem := plot_unavailable()):  # said before anything is read or printed
        raise click.ClickException(problem)
    state = open_state(config)
    try:
        data = read_report(state, time.time() - seconds)
    finally:
        state.close()
    table = data.table(width)
    if as_json:
        click.echo(json.dumps(table, indent=2))
    else:
        click.echo(render_table(table), nl=False)
    if png:
        from gridgate.core.report import draw, save_png

        save_png(draw(table), png)
        click.echo(f"plot written to {png}", err=True)


@cli.group("servers")
def servers_group() -> None:
    """Servers out of rotation (failing cache) or watched (tickets window), and putting them back."""


def open_state_or_exit(path: str) -> Any:
    """The state store the config at ``path`` names; exit 1 for one no other process can read."""
    from gridgate.core.state import open_state

    config = load_config_or_exit(path)
    if (config.get("state") or {}).get("driver") == "memory":
        click.echo(
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
    """What the failing and tickets caches hold now, read from the director's state store."""
    from gridgate.core.bans import OperatorBans
    from gridgate.core.failing import FailingCache
    from gridgate.core.state import StateError

    state = open_state_or_exit(path)
    try:
        rows = FailingCache(state).view(time.time())
        try:
            bans = [entry.as_dict() for entry in OperatorBans(state).entries()]
        except StateError as exc:
            click.echo(f"{path}: cannot read the operator bans: {exc}", err=True)
            raise SystemExit(1) from None
    finally:
        state.close()
    if as_json:
        doc: dict[str, Any] = {"servers": rows}
        if bans:
            doc["bans"] = bans
        click.echo(json.dumps(doc, indent=2))
        return
    if bans:  # before the caches, which print as they always did
        _echo_bans(bans)
        click.echo("")
    if not rows:
        click.echo("every server is in rotation; no failure episode is open")
        return
    click.echo(
        f"{'SERVER':<44}{'STATUS':<13}{'KIND':<13}{'EPISODE SINCE (UTC)':<21}{'FAILURES':>9}  "
        f"{'OUT UNTIL (UTC)':<21}{'ALARM IF IT FAILS BEFORE (UTC)'}"
    )
    for r in rows:
        click.echo(
            f"{r['server']:<44}{r['status']:<13}{r['kind'] or '-':<13}{_utc(r['episode_start']):<21}"
            f"{r['failures']:>9}  {_utc(r['failing_until']):<21}{_utc(r['tickets_until'])}"
        )


def _echo_bans(bans: list[dict[str, Any]]) -> None:
    click.echo(f"{'BANNED OR DRAINED':<44}{'STATE':<9}{'BY':<13}{'UNTIL (UTC)':<21}WHY")
    for entry in sorted(bans, key=lambda e: str(e["endpoint"])):
        click.echo(
            f"{entry['endpoint']:<44}{entry['state']:<9}{entry['who']:<13}"
            f"{_utc(entry['until']):<21}{entry['why']}"
        )


def _operator() -> str:
    """Who runs the command: ``SUDO_USER`` when run through sudo, else the login of the
    calling user (its uid's name)."""
    import os
    import pwd

    sudo = os.environ.get("SUDO_USER")
    if sudo:
        return sudo
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid{os.getuid()}"


def _known_endpoints(config: Any, state: Any) -> list[Any]:
    """The endpoints an operator may name: every configured backend's (its section's
    endpoint list), and those the pilot registry holds pilots of (a backend registered in the
    director's process)."""
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
    for backend, name, _state in counts:
        endpoint = Endpoint(str(backend), str(name))
        found.setdefault(endpoint.key, endpoint)
    return list(found.values())


@contextmanager
def _bans_command(path: str, verb: str) -> Iterator[tuple[Any, Any]]:
    """The config and the open state store for one ``gridgate servers VERB``: a BanError in
    the block is a usage error naming the command (exit 2), a store that cannot be written
    exit 1; the store is closed after."""
    from gridgate.core.bans import BanError
    from gridgate.core.state import StateError

    config = load_config_or_exit(path)
    store = open_state_or_exit(path)
    try:
        try:
            yield config, store
        except BanError as exc:
            click.echo(f"gridgate servers {verb}: {exc}", err=True)
            raise SystemExit(EXIT_CONFIG) from None
        except StateError as exc:
            click.echo(f"{path}: cannot write to the state store: {exc}", err=True)
            raise SystemExit(1) from None
    finally:
        store.close()


def _withdraw(path: str, endpoint: str, state_name: str, duration: str, reason: str) -> None:
    from gridgate.core.bans import OperatorBans, parse_duration, resolve_endpoint

    with _bans_command(path, _VERB[state_name]) as (config, store):
        seconds = parse_duration(duration)
        key = resolve_endpoint(endpoint, _known_endpoints(config, store)).key
        entry = OperatorBans(store).put(
            key, state_name, who=_operator(), why=reason, duration=seconds
        )
    click.echo(
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
    director on it honours it from its next iteration. Recorded as SUDO_USER when run through
    sudo, else as your login."""
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
    from gridgate.core.bans import OperatorBans, resolve_endpoint

    with _bans_command(path, "unban") as (config, store):
        key = resolve_endpoint(endpoint, _known_endpoints(config, store)).key
        lifted = OperatorBans(store).unban(key)
    if lifted is None:
        click.echo(f"{key}: not banned or drained")
    else:
        click.echo(f"{key}: {lifted.state} by {lifted.who} lifted ({lifted.why})")


@servers_group.command("clear")
@click.argument("servers", nargs=-1)
@click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False))
@click.option("--all", "everything", is_flag=True, help="Every server, and the local-fault notes.")
@click.option("--json", "as_json", is_flag=True, help="What was cleared, as JSON.")
def servers_clear(servers: tuple[str, ...], path: str, everything: bool, as_json: bool) -> None:
    """Put SERVERS (host names or backend/host) back in rotation now, as if they had never failed.

    For a server the site has fixed: the director uses it from its next iteration, and its next
    failure starts a new episode (an error mail, not an alarm)."""
    from gridgate.core.failing import FailingCache

    if not servers and not everything:
        raise click.UsageError("name at least one server, or --all")
    state = open_state_or_exit(path)
    try:
        cleared = FailingCache(state).clear(list(servers), everything=everything)
    finally:
        state.close()
    missing = sorted(
        n for n in servers if not any(c == n or c.split("/", 1)[-1] == n for c in cleared)
    )
    if as_json:
        click.echo(json.dumps({"cleared": cleared, "not_found": missing}))
    else:
        for key in cleared:
            click.echo(f"cleared {key}")
        for name in missing:
            click.echo(f"{name}: not in the caches (already in rotation)")


@cli.group("notify")
def notify_group() -> None:
    """Notification tools."""


@notify_group.command("test")
@click.option("-c", "--config", "path", required=True, type=click.Path(dir_okay=False))
@click.option(
    "--level", type=click.Choice(["error", "alarm", "info"]), default="error", show_default=True
)
@click.option("--wait", default=30.0, show_default=True, help="Seconds to wait for delivery.")
def notify_test(path: str, level: str, wait: float) -> None:
    """Send a test notification through every configured notifier and say what happened."""
    from gridgate.core.director import Director
    from gridgate.core.model import Notification

    config = load_config_or_exit(path)
    director = Director(config, serve_metrics=False)  # the running director holds metrics_port
    note = Notification(
        level=level,  # type: ignore[arg-type]
        subject=f"gridgate test {level} notification",
        body=f"This is a test sent by `gridgate notify test` at {time.ctime()}.\n",
        created=time.time(),
        key=f"test/{time.time():.0f}",
    )
    failed = False
    try:
        for name, plugin in director.pm.list_name_plugin():
            if not hasattr(plugin, "gridgate_notify"):
                continue
            try:
                plugin.gridgate_notify(notification=note)
                flush = getattr(plugin, "flush", None)
                outcome = flush(timeout=wait) if callable(flush) else "done"
                click.echo(f"{name}: {outcome if outcome is not None else 'done'}")
            except Exception as exc:
                failed = True
                click.echo(f"{name}: FAILED: {type(exc).__name__}: {exc}")
    finally:
        director.close()
    if failed:
        raise SystemExit(1)


def _report_cli_plugin_error(error: PluginLoadError) -> None:
    click.echo(f"gridgate: warning: {error}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``gridgate`` console script."""
    pm = cli_plugin_manager(on_error=_report_cli_plugin_error)
    pm.hook.gridgate_register_commands(cli=cli)
    cli.main(args=argv, prog_name="gridgate")


if __name__ == "__main__":  # pragma: no cover
    main()
