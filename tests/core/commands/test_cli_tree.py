"""Every ``gridgate`` command, the built-in providers' included, walked as ``gridgate`` builds
it: no two parameters of one command share a flag or a name, and neither building a command
nor its ``--help`` makes click warn (click keeps the last of two ``-c`` and warns at each run:
issue 40 item 8, ``lsfproxyd diagnose``'s ``-c FILE`` refused as a class)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import click

from gridgate.core.commands.app import build_cli


def commands() -> Iterator[tuple[str, click.Command, click.Context]]:
    """``(path, command, context)`` for the root and every command under it; each context
    the child of its group's, as click makes them (help option names inherited)."""
    root = build_cli()

    def walk(
        command: click.Command, ctx: click.Context, path: str
    ) -> Iterator[tuple[str, click.Command, click.Context]]:
        yield path, command, ctx
        if isinstance(command, click.Group):
            for name in sorted(command.list_commands(ctx)):
                sub = command.get_command(ctx, name)
                assert sub is not None, f"{path} {name}"
                child = click.Context(sub, parent=ctx, info_name=name, **sub.context_settings)
                yield from walk(sub, child, f"{path} {name}")

    yield from walk(
        root, click.Context(root, info_name="gridgate", **root.context_settings), "gridgate"
    )


def clashes(command: click.Command, ctx: click.Context) -> list[str]:
    """Each flag or name two parameters of ``command`` share, its help option's included
    (click drops a help name another option takes, silently: ``-h`` would stop being help)."""
    owner = {name: "/".join(ctx.help_option_names) for name in ctx.help_option_names}
    found = []
    for param in command.params:
        label = "/".join(param.opts) or str(param.name)
        spellings = [*param.opts, *param.secondary_opts]
        if param.expose_value:
            spellings.append(f"name {param.name}")
        for spelling in dict.fromkeys(spellings):
            if spelling in owner:
                found.append(f"{spelling}: {owner[spelling]} and {label}")
            owner[spelling] = label
    return found


def test_the_walk_reaches_the_built_in_providers_commands() -> None:
    paths = {path for path, _, _ in commands()}
    for path in (
        "gridgate lsfproxyd diagnose",  # lsf_proxy
        "gridgate gate",  # lsf_gate
        "gridgate outbox list",  # outbox
        "gridgate pilots list",  # pilots
        "gridgate plugin new",  # devkit
        "gridgate demo",
        "gridgate servers ban",  # core's own
        "gridgate config validate",
    ):
        assert path in paths, path


def test_no_command_has_two_parameters_with_one_flag_or_name() -> None:
    found = [f"{path}: {clash}" for path, cmd, ctx in commands() for clash in clashes(cmd, ctx)]
    assert found == []


def test_no_command_makes_click_warn_when_built_or_asked_for_help() -> None:
    told = []
    for path, command, ctx in commands():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            command.get_params(ctx)
            text = ctx.get_help()  # what --help prints
        assert text.startswith("Usage: "), path
        told += [f"{path}: {w.message}" for w in caught]
    assert told == []


def test_the_clash_check_sees_a_shared_flag_a_shared_name_and_the_help_option() -> None:
    @click.command()
    @click.option("-c", "--config", "config")
    @click.option("-c", "what")
    @click.option("--other", "config")
    @click.option("-h", "hosts")
    def command(config: str, what: str, hosts: str) -> None:
        """A command with every kind of clash."""

    root = click.Group(context_settings={"help_option_names": ["-h", "--help"]})
    ctx = click.Context(command, parent=click.Context(root, **root.context_settings))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # click's own warning, for the duplicate -c
        found = clashes(command, ctx)
    assert found == [
        "-c: -c/--config and -c",
        "name config: -c/--config and --other",
        "-h: -h/--help and -h",
    ]
