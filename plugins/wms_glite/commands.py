"""Adds `gridgate demo` to the command line."""

from __future__ import annotations

import click

from gridgate.core import hookimpl


class Commands:
    """gridgate.cli provider of the wms_glite plugin."""

    @hookimpl
    def gridgate_register_commands(self, cli: click.Group) -> None:
        from gridgate.plugins.wms_glite.demo import demo_command

        cli.add_command(demo_command)
