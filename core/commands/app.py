"""The ``gridgate`` command line: its group, the commands of the director (run, config, report,
notify, plugins) and :func:`main`; the only place where log sinks are configured. Plugins add
theirs through ``gridgate_register_commands`` (``servers`` is :mod:`.servers`; the author's
commands, ``docs`` and ``plugin new``, come from the devkit's provider)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click
from loguru import logger

from gridgate.core import __version__
from gridgate.core.cli import EXIT_CONFIG, echo, load_config_or_exit
from gridgate.core.commands import servers
from gridgate.core.commands.logs import configure_logging, on_journal
from gridgate.core.config import ConfigError, compose_schema
from gridgate.core.engine.loader import cli_plugin_manager, installed_plugins
from gridgate.core.plugins import PluginLoadError
from gridgate.core.text import printable


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gridgate")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.option("--log-json", is_flag=True, help="Structured JSON logs on stderr.")
def cli(verbose: int, log_json: bool) -> None:
    """gridgate keeps grid and batch submission flowing when the services behind it misbehave."""
    configure_logging(verbose, log_json)


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


@cli.group("config")
def config_group() -> None:
    """Validate a config, print its schema or an example."""


@config_group.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def config_validate(files: tuple[str, ...]) -> None:
    """Check config FILES; exit 0 when all are valid, 2 otherwise.

    A file with a director, backends or demand section must also leave something to submit
    (or say director.paused: true). Warnings (legal, probably not meant) do not fail."""
    from gridgate.core.engine.config_checks import checked_config, config_warnings

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
        from gridgate.core.config import read_document

        doc = read_document(path) or {}
    schema, _classes, problems = compose_schema(doc)
    for where, message in problems:
        click.echo(f"{path}: {'.'.join(map(str, where))}: {message}", err=True)
    click.echo(json.dumps(schema, indent=2))
    if problems:
        raise SystemExit(EXIT_CONFIG)


@config_group.command("example")
@click.option(
    "--backend",
    "backend",
    metavar="NAME",
    help="A site of this backend (any installed one: arc, slurm, sge, lsf, wms_glite...); "
    "default: gLite WMS.",
)
def config_example(backend: str | None) -> None:
    """Print a complete, commented site config that validates."""
    from importlib.resources import files

    from gridgate.core.plugins import CONFIG_GROUPS, PluginLoadError, plugin_example

    if backend is None:
        text = files("gridgate.core.commands").joinpath("example.yaml").read_text(encoding="utf-8")
    else:
        try:
            found = plugin_example(CONFIG_GROUPS["backends"], backend)
        except PluginLoadError as exc:
            click.echo(f"--backend {backend}: {exc}", err=True)
            raise SystemExit(EXIT_CONFIG) from None
        if found is None:
            click.echo(
                f"--backend {backend}: the plugin ships no example site config "
                f"(an example.yaml beside its module)",
                err=True,
            )
            raise SystemExit(EXIT_CONFIG)
        text = found
    click.echo(text, nl=False)


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
    import threading

    from gridgate.core.engine.config_checks import checked_config, submission_problems
    from gridgate.core.engine.director import Director, summary_json
    from gridgate.core.engine.reload import ConfigSource

    try:
        # as config validate checks it: a file without its final newline (cut short?) and a
        # director config that leaves nothing to submit are refused here as on a reload
        config = checked_config(path)
        # a config that is not a director's yet (no backend, no demand) is refused here too
        idle = submission_problems(config)
        if idle:
            raise ConfigError(idle)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(str(problem), err=True)
        raise SystemExit(EXIT_CONFIG) from None
    director = Director(ConfigSource(path, initial=config))
    stopping = threading.Event()

    def stop(signum: int, _frame: Any) -> None:
        logger.warning("signal {} received: finishing the commands in flight", signum)
        director.stop()
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    # the journal stamps each line; written anywhere else, an iteration line says its time as
    # the log lines beside it do
    stamped = not as_json and not on_journal(sys.stdout)

    def emit(summary: Any) -> None:
        if as_json:
            click.echo(summary_json(summary))
            return
        line = journal_line(summary, bool(director.config.director.get("paused")))
        click.echo(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}" if stamped else line)

    failed: list[BaseException] = []

    def loop() -> None:
        try:
            director.run(iterations=1 if once else iterations, on_iteration=emit)
        except BaseException as exc:  # re-raised in the main thread below
            failed.append(exc)

    # the loop runs in a thread of its own so that a stop is kept whatever it is blocked in
    # (a plugin, a file, a store that no longer answers): the main thread only waits
    worker = threading.Thread(target=loop, name="director", daemon=True)
    worker.start()
    while worker.is_alive() and not stopping.is_set():
        worker.join(0.5)
    if stopping.is_set():
        bound = director.runtime.settings.stop_timeout
        worker.join(bound)
        if worker.is_alive():
            logger.error(
                "the director did not stop within stop_timeout ({:g} s) and exits anyway; "
                "it was still in: {}",
                bound,
                _where(worker),
            )
            sys.stdout.flush()
            os._exit(1)  # nothing else to wait for: the commands in flight die with it
    director.close()
    if failed:
        raise failed[0]


def _where(thread: Any) -> str:
    """The innermost frames of ``thread``, for the log line of a director that would not stop."""
    import traceback

    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return "(gone)"
    stack = traceback.extract_stack(frame)[-3:]
    return "; ".join(
        f"{f.name} at {f.filename}:{f.lineno} ({(f.line or '').strip()})" for f in stack
    )


def journal_line(summary: Any, paused: bool = False) -> str:
    """The one line an iteration writes to the journal (``gridgate -v run``): per backend, what
    the demand asked (with the waiting work it was sized from), the pilots waiting, what was
    submitted, trimmed by which limit, skipped and why, failed; an unusable credential; the
    endpoints excluded."""
    backends: dict[str, dict[str, Any]] = {}

    def of(backend: str) -> dict[str, Any]:
        return backends.setdefault(
            backend,
            {"demand": 0, "figures": [], "waiting": 0, "submitted": 0, "failed": 0, "skipped": {}},
        )

    for figure in summary.demand:
        row = of(figure.backend)
        row["demand"] += figure.pilots
        if figure.jobs is not None:
            held = (
                ""
                if figure.fresh
                else ", source unreadable past keep_last"
                if figure.stale
                else ", held"
            )
            row["figures"].append(
                f"{figure.source or 'source'} {figure.group} {figure.jobs} jobs{held}"
            )
    for record in summary.records:
        row = of(record.backend)
        if record.outcome == "submitted":
            row["submitted"] += record.pilots
        elif record.outcome == "failed":
            row["failed"] += 1
        elif record.outcome == "skipped":
            cause = record.failure_kind or "skipped"
            row["skipped"][cause] = row["skipped"].get(cause, 0) + record.pilots
    if summary.pilots is not None:
        for key, states in summary.pilots.states.items():
            backend = key.partition("/")[0]
            if states.get("waiting"):
                of(backend)["waiting"] += states["waiting"]
    parts = []
    for backend, row in sorted(backends.items()):
        text = f"{backend}: demand {row['demand']}"
        if row["figures"]:
            text += f" ({', '.join(row['figures'])})"
        text += f", waiting {row['waiting']}, submitted {row['submitted']}"
        skipped = row["skipped"]
        trims = {k: v for k, v in skipped.items() if k.startswith("max_")}
        others = {k: v for k, v in skipped.items() if k not in trims}
        if trims:
            text += ", trimmed " + ", ".join(f"{n} by {k}" for k, n in sorted(trims.items()))
        if others:
            text += ", skipped " + ", ".join(f"{n} ({k})" for k, n in sorted(others.items()))
        if row["failed"]:
            text += f", failed {row['failed']}"
        parts.append(text)
    for status in summary.credentials:
        if not status.usable:
            users = summary.credential_users.get(status.name) or ()
            waiting = f", {', '.join(users)} waiting" if users else ""
            parts.append(
                f"credential {status.name} ({status.kind}) unusable{waiting}: {status.message}"
            )
    if summary.excluded:
        parts.append(f"excluded {', '.join(summary.excluded)}")
    if not parts:
        parts.append("paused (director.paused)" if paused else "no demand")
    return f"iteration {summary.number}: {summary.duration:.1f} s; " + "; ".join(parts)


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
    from gridgate.core.commands.report import (
        parse_duration,
        plot_unavailable,
        read_report,
        render_table,
    )
    from gridgate.core.state import open_state

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
        data = read_report(state, time.time() - seconds, width)
    finally:
        state.close()
    table = data.table(width)
    if as_json:
        click.echo(json.dumps(table, indent=2))
    else:
        click.echo(printable(render_table(table)), nl=False)  # episodes quote feeds, users
    if png:
        from gridgate.core.commands.report import draw, save_png

        save_png(draw(table), png)
        click.echo(f"plot written to {png}", err=True)


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
    from gridgate.core.commands.notify import test_notification, try_notifier
    from gridgate.core.engine.director import Director

    config = load_config_or_exit(path)
    director = Director(config, serve_metrics=False)  # the running director holds metrics_port
    note = test_notification(level)
    failed = False
    try:
        for name, plugin in director.pm.list_name_plugin():
            if not hasattr(plugin, "gridgate_notify"):
                continue
            try:
                lines, bad = try_notifier(plugin, note, wait)
            except Exception as exc:
                lines, bad = [f"FAILED: {type(exc).__name__}: {exc}"], True
            failed = failed or bad
            for line in lines:
                echo(f"{name}: {line}")  # servers' replies quoted
    finally:
        director.close()
    if failed:
        raise SystemExit(1)


def _report_cli_plugin_error(error: PluginLoadError) -> None:
    click.echo(f"gridgate: warning: {error}", err=True)


cli.add_command(servers.servers_group)


def build_cli() -> click.Group:
    """The ``gridgate`` group with the commands of every installed ``gridgate.cli``
    provider added, as :func:`main` runs it."""
    pm = cli_plugin_manager(on_error=_report_cli_plugin_error)
    pm.hook.gridgate_register_commands(cli=cli)
    return cli


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``gridgate`` console script."""
    build_cli().main(args=argv, prog_name="gridgate")


if __name__ == "__main__":  # pragma: no cover
    main()
