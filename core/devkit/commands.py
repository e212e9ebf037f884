"""The author's commands, a command-line provider like any plugin's (entry point ``devkit`` of
``gridgate.cli``): ``gridgate docs [--check]`` (every generated reference), ``gridgate config
docs`` (the configuration reference of what is installed) and ``gridgate plugin new`` (a plugin
package of your own). This module imports nothing of the devkit until one of them runs."""

from __future__ import annotations

import click

from gridgate.core import hookimpl
from gridgate.core.cli import EXIT_CONFIG


@click.group("plugin")
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

    from gridgate.core.devkit.scaffold import ScaffoldError, new_plugin, next_steps

    try:
        written = new_plugin(kind, name, Path(folder) if folder else None, shape=shape)
    except ScaffoldError as exc:
        click.echo(f"gridgate plugin new: {exc}", err=True)
        raise SystemExit(EXIT_CONFIG) from None
    root = written[0].parent
    steps = next_steps(kind, root, shape)
    click.echo(f"wrote {len(written)} files in {root}; next:\n{steps}", nl=False)


@click.command("docs")
@click.option(
    "--all", "everything", is_flag=True, help="Include plugins of other distributions too."
)
def config_docs(everything: bool) -> None:
    """Print the configuration reference (Markdown) generated from the composed schema."""
    from gridgate.core.devkit.docgen import render

    click.echo(render(all_distributions=everything), nl=False)


@click.command("docs")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when a page is stale.")
@click.option(
    "--docs",
    "folder",
    type=click.Path(file_okay=False),
    help="The docs folder (default: the one beside the sources).",
)
@click.option(
    "--fingerprint",
    is_flag=True,
    help="Record the plugin API's fingerprint for the current API_VERSION instead.",
)
def docs_command(check: bool, folder: str | None, fingerprint: bool) -> None:
    """Write the pages generated from the code (api.md, hooks.md, kinds.md, configuration.md,
    the generated parts of notifications.md); with --check, exit 1 naming the stale ones."""
    from pathlib import Path

    from gridgate.core.devkit import docs, refdocs

    if fingerprint:
        click.echo(refdocs.record_fingerprint())
        return
    written, stale = docs.regenerate(Path(folder) if folder else docs.DOCS, check=check)
    for path in written:
        click.echo(f"wrote {path}")
    if check and stale:
        click.echo(
            f"stale: {', '.join(p.name for p in stale)}; regenerate with: gridgate docs", err=True
        )
        raise SystemExit(1)


class Commands:
    """Adds the author's commands to ``gridgate``."""

    @hookimpl
    def gridgate_register_commands(self, cli: click.Group) -> None:
        cli.add_command(plugin_group)
        cli.add_command(docs_command)
        config = cli.commands.get("config")
        if isinstance(config, click.Group):
            config.add_command(config_docs)
