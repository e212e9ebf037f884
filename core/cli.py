"""The ``gridgate`` command line; the only place where log sinks are configured."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from loguru import logger

from gridgate.core import __version__
from gridgate.core.config import ConfigError, compose_schema, load_config
from gridgate.core.plugins import PluginLoadError, cli_plugin_manager, installed_plugins

#: Exit code for a config that cannot be used (file, line and key are printed).
EXIT_CONFIG = 2


def configure_logging(verbose: int, log_json: bool) -> None:
    """Send logs to stderr; stdout stays for machine-readable output."""
    logger.remove()
    level = "WARNING" if verbose == 0 else ("INFO" if verbose == 1 else "DEBUG")
    if log_json:
        logger.add(sys.stderr, level=level, serialize=True)
    else:
        logger.add(sys.stderr, level=level, format="{time:YYYY-MM-DD HH:mm:ss} {level: <7} {message}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gridgate")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.option("--log-json", is_flag=True, help="Structured JSON logs on stderr.")
def cli(verbose: int, log_json: bool) -> None:
    """gridgate keeps grid and batch submission flowing when the services behind it misbehave."""
    configure_logging(verbose, log_json)


def load_config_or_exit(path: str) -> Any:
    """Load a config for a command; on failure print every problem and exit 2."""
    try:
        return load_config(path)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(str(problem), err=True)
        raise SystemExit(EXIT_CONFIG) from None


@cli.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of a table.")
def plugins_command(as_json: bool) -> None:
    """List every installed plugin per entry-point group."""
    rows = installed_plugins()
    if as_json:
        groups: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            groups.setdefault(row.group, []).append(
                {"name": row.name, "target": row.target, "distribution": row.distribution,
                 "version": row.version, "default": row.default}
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
    """Check config FILES; exit 0 when all are valid, 2 otherwise."""
    bad = False
    for path in files:
        try:
            load_config(path)
        except ConfigError as exc:
            bad = True
            for problem in exc.problems:
                click.echo(str(problem), err=True)
        else:
            click.echo(f"{path}: valid")
    if bad:
        raise SystemExit(EXIT_CONFIG)


@config_group.command("schema")
@click.option("-c", "--config", "path", type=click.Path(dir_okay=False),
              help="Include the sections of the plugins this config names.")
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


def _report_cli_plugin_error(error: PluginLoadError) -> None:
    click.echo(f"gridgate: warning: {error}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``gridgate`` console script."""
    pm = cli_plugin_manager(on_error=_report_cli_plugin_error)
    pm.hook.gridgate_register_commands(cli=cli)
    cli.main(args=argv, prog_name="gridgate")


if __name__ == "__main__":  # pragma: no cover
    main()
