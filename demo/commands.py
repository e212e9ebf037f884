"""Adds `gridgate demo` to the command line (a ``gridgate.cli`` provider)."""

from __future__ import annotations

import click

from gridgate.core import hookimpl


class Commands:
    """gridgate.cli provider of the demo."""

    @hookimpl
    def gridgate_register_commands(self, cli: click.Group) -> None:
        from gridgate.demo.demo import demo_command

        cli.add_command(demo_command)
