"""``gridgate lsfproxyd ...``: run the token daemon and administer it like ``badmin lsfproxyd``."""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from gridgate.core import hookimpl
from gridgate.core.cli import EXIT_CONFIG, load_config_or_exit
from gridgate.core.secrets import SecretError
from gridgate.plugins.lsf_proxy.cli import render
from gridgate.plugins.lsf_proxy.client.client import HostReply, ProxyClient
from gridgate.plugins.lsf_proxy.config import section_defaults
from gridgate.plugins.lsf_proxy.wire import ProxyError

#: Exit code when a daemon could not be reached or refused the command.
EXIT_FAILED = 1


def _section(config_path: str | None) -> dict[str, Any]:
    if not config_path:
        return section_defaults()
    config = load_config_or_exit(config_path)
    return dict(config.get("proxyd") or section_defaults())


def _options(*config_flags: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--json``, ``--socket PATH`` and the site config spelled ``config_flags``."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        return _with_options(func, config_flags)

    return decorate


def _with_options(func: Callable[..., Any], config_flags: Sequence[str]) -> Callable[..., Any]:
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
    @click.option(
        "--socket",
        "socket_path",
        metavar="PATH",
        help="The daemon's Unix socket (default: $GRIDGATE_PROXYD_SOCKET, the config, "
        "the runtime directory).",
    )
    @click.option(
        *config_flags,
        "config_path",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        help="Site config with a proxyd: section.",
    )
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


#: the options of every admin command: ``-c/--config FILE``, as ``gridgate gate`` spells it
_common = _options("-c", "--config")


def _client(config_path: str | None, socket_path: str | None) -> ProxyClient:
    section = _section(config_path)
    try:
        return ProxyClient.from_section(section, socket_path)
    except SecretError as exc:
        click.echo(f"gridgate lsfproxyd: {exc}", err=True)
        raise SystemExit(EXIT_CONFIG) from None


def _run(
    op: str,
    config_path: str | None,
    socket_path: str | None,
    as_json: bool,
    text: Callable[[Sequence[HostReply]], list[str]],
    **fields: Any,
) -> None:
    client = _client(config_path, socket_path)
    try:
        replies = client.admin(op, **fields)
    except ProxyError as exc:
        click.echo(f"gridgate lsfproxyd: {exc}", err=True)
        raise SystemExit(EXIT_FAILED) from None
    failed = [r for r in replies if r.reply is None or not r.reply.get("ok")]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "op": op,
                    "hosts": [
                        {
                            "name": r.daemon.name,
                            "address": r.daemon.address,
                            "ok": bool(r.reply and r.reply.get("ok")),
                            **({"reply": r.reply} if r.reply is not None else {"error": r.error}),
                        }
                        for r in replies
                    ],
                },
                indent=2,
            )
        )
    else:
        for line in text(replies):
            click.echo(line)
    for reply in failed:
        if reply.reply is not None and (reply.reply.get("error") or {}).get("code") == "forbidden":
            click.echo(
                f"gridgate lsfproxyd: {reply.daemon.name}: {reply.reply['error']['message']}",
                err=True,
            )
    if failed:
        raise SystemExit(EXIT_FAILED)


def _names(text: str | None) -> list[str]:
    return (text or "").split()


@click.group("lsfproxyd")
def lsfproxyd() -> None:
    """The lsfproxyd-style token daemon and its admin commands (as badmin lsfproxyd)."""


@lsfproxyd.command("serve")
@_common
@click.option("--name", help="This daemon's name in proxyd.hosts (default: proxyd.name, the host).")
def serve(
    as_json: bool, socket_path: str | None, config_path: str | None, name: str | None
) -> None:
    """Run the daemon until SIGTERM; SIGHUP re-reads the config.

    Prints one line when it listens (a JSON object with --json: name, socket, pid, tcp_port,
    metrics_port).
    """
    # imported here: the other commands should not pay for asyncio and the daemon
    from gridgate.plugins.lsf_proxy.daemon.daemon import ProxyDaemon, StartupError

    section = _section(config_path)

    def ready(daemon: ProxyDaemon) -> None:
        info = {
            "ready": True,
            "name": daemon.name,
            "socket": daemon.socket_path,
            "pid": daemon.pid,
            "tcp_port": daemon.tcp_port,
            "metrics_port": daemon.metrics_port,
        }
        click.echo(
            json.dumps(info)
            if as_json
            else f"lsfproxyd {daemon.name} listening on {daemon.socket_path} (pid {daemon.pid})"
        )
        sys.stdout.flush()

    try:
        daemon = ProxyDaemon(section, socket_path=socket_path, name=name, config_path=config_path)
        daemon.on_ready = ready
        asyncio.run(daemon.serve())
    except (StartupError, SecretError, OSError) as exc:
        click.echo(f"gridgate lsfproxyd serve: {exc}", err=True)
        raise SystemExit(EXIT_FAILED) from None


@lsfproxyd.command("status")
@_common
def status(as_json: bool, socket_path: str | None, config_path: str | None) -> None:
    """Service status, tokens in use and the metrics of every daemon."""
    _run("status", config_path, socket_path, as_json, render.status_text)


def _enable_command(op: str) -> Callable[..., None]:
    @_common
    @click.argument("category", type=click.Choice(["all", "query", "sub", "other"]))
    def command(
        category: str, as_json: bool, socket_path: str | None, config_path: str | None
    ) -> None:
        _run(op, config_path, socket_path, as_json, render.enable_text, category=category)

    command.__doc__ = (
        f"{op.capitalize()} token distribution for all, query, sub or other "
        "requests" + (" (disabled: clients proceed without a token)." if op == "disable" else ".")
    )
    return command


lsfproxyd.command("enable")(_enable_command("enable"))
lsfproxyd.command("disable")(_enable_command("disable"))


def _block_command(op: str) -> Callable[..., None]:
    @_common
    @click.argument("everything", required=False, type=click.Choice(["all"]))
    @click.option("-u", "users", metavar='"USER ..."', help="Users (space separated).")
    @click.option("-m", "hosts", metavar='"HOST ..."', help="Hosts (space separated).")
    def command(
        everything: str | None,
        users: str | None,
        hosts: str | None,
        as_json: bool,
        socket_path: str | None,
        config_path: str | None,
    ) -> None:
        if everything and (users or hosts):
            raise click.UsageError("'all' cannot be combined with -u or -m")
        if not everything and not _names(users) and not _names(hosts):
            raise click.UsageError('give all, -u "user ..." and/or -m "host ..."')
        _run(
            op,
            config_path,
            socket_path,
            as_json,
            functools.partial(render.block_text, op),
            all=bool(everything),
            users=_names(users),
            hosts=_names(hosts),
        )

    command.__doc__ = (
        f"{op.capitalize()} all, users, hosts, or users at hosts; each named "
        "element is a rule of its kind"
        + (
            " (a user, a host, a user@host)."
            if op == "block"
            else ": unblocking user1 leaves user1@host1."
        )
    )
    return command


lsfproxyd.command("block")(_block_command("block"))
lsfproxyd.command("unblock")(_block_command("unblock"))


@lsfproxyd.command("blocklist")
@_common
def blocklist(as_json: bool, socket_path: str | None, config_path: str | None) -> None:
    """Who is blocked, per daemon."""
    _run("blocklist", config_path, socket_path, as_json, render.blocklist_text)


@lsfproxyd.command("diagnose")
# -c is the class here, as in badmin diagnose -c CLASS: the config is --config only
@_options("--config")
@click.argument("state", type=click.Choice(["on", "off"]))
@click.option(
    "-t",
    "minutes",
    type=click.FloatRange(min=0, min_open=True),
    metavar="MINUTES",
    help="With on: turn diagnosis off by itself after this many minutes (as badmin diagnose -t).",
)
@click.option(
    "-f",
    "log_file",
    metavar="FILE",
    help="With on: log to FILE, a bare name (letters, digits, '.', '_', '-') of a "
    "file next to the default log, until diagnosis ends (as badmin diagnose "
    "-f); a path is refused.",
)
@click.option(
    "-c",
    "--class",
    "what",
    type=click.Choice(["requests", "bypass"]),
    default="requests",
    show_default=True,
    help="requests: the token requests (ENABLE_DIAGNOSE); bypass: for a while (-t, default "
    "10, at most 60 minutes) the scheduler logs every request it serves, and each is written "
    "with whether its user held a token (needs proxyd.bypass.scheduler).",
)
def diagnose(
    state: str,
    minutes: float | None,
    log_file: str | None,
    what: str,
    as_json: bool,
    socket_path: str | None,
    config_path: str | None,
) -> None:
    """Switch the diagnostic log of every request on or off.

    -c CLASS is badmin diagnose's class (-c bypass); the site config is --config FILE.
    """
    if state == "off" and (minutes is not None or log_file):
        raise click.UsageError("-t and -f go with 'diagnose on'")

    def describe(reply: HostReply) -> str:
        r = reply.reply or {}
        until = (
            f" until {time.strftime('%a %b %d %H:%M:%S', time.localtime(r['until']))}"
            if r.get("until")
            else ""
        )
        if r.get("class") == "bypass":
            return (
                f"lsfproxyd bypass diagnosis {'ON' if r.get('diagnose') else 'OFF'} "
                f"({r.get('file')}){until} on lsfproxyd host <{reply.daemon.name}>"
            )
        return (
            f"lsfproxyd diagnostic log {'ON' if r.get('diagnose') else 'OFF'} "
            f"({r.get('file')}){until} on lsfproxyd host <{reply.daemon.name}>"
        )

    fields: dict[str, Any] = {"on": state == "on"}
    if what != "requests":
        fields["class"] = what
    if minutes is not None:
        fields["minutes"] = minutes
    if log_file:
        fields["file"] = log_file
    _run(
        "diagnose",
        config_path,
        socket_path,
        as_json,
        lambda replies: render.simple_text(replies, describe),
        **fields,
    )


@lsfproxyd.command("reconfig")
@_common
def reconfig(as_json: bool, socket_path: str | None, config_path: str | None) -> None:
    """Make every daemon re-read its config file (as SIGHUP does)."""

    def describe(reply: HostReply) -> str:
        return f"lsfproxyd host <{reply.daemon.name}>: {(reply.reply or {}).get('message')}"

    _run(
        "reconfig",
        config_path,
        socket_path,
        as_json,
        lambda replies: render.simple_text(replies, describe),
    )


@lsfproxyd.command("import-lsf")
@click.option(
    "--lsf-conf",
    "lsf_conf",
    type=click.Path(dir_okay=False, exists=True),
    help="The site's lsf.conf (LSF_PROXYD_*, LSF_ADDON_HOSTS).",
)
@click.option(
    "--lsb-params",
    "lsb_params",
    type=click.Path(dir_okay=False, exists=True),
    help="The site's lsb.params (PROXYD_POLICIES, MAX_CONCURRENT_QUERY, ENABLE_DIAGNOSE).",
)
@click.option(
    "--key-file",
    default="/etc/gridgate/proxyd.key",
    show_default=True,
    help="Where the shared TCP key is to live (named in the output).",
)
def import_lsf(lsf_conf: str | None, lsb_params: str | None, key_file: str) -> None:
    """Print a commented proxyd: section made from LSF's own files (checked before printing);
    what cannot be carried over is named with the reason."""
    from gridgate.core.config import ConfigError, load_config
    from gridgate.plugins.lsf_proxy.cli import lsfimport

    if not lsf_conf and not lsb_params:
        raise click.UsageError("give --lsf-conf FILE and/or --lsb-params FILE")
    try:
        conf = lsfimport.parse(_read(lsf_conf), lsf_conf) if lsf_conf else {}
        params = (
            lsfimport.parse(_read(lsb_params), lsb_params, sectioned=True) if lsb_params else {}
        )
        text = lsfimport.section_text(conf, params, key_file)
    except lsfimport.LsfConfError as exc:
        click.echo(f"gridgate lsfproxyd import-lsf: {exc}", err=True)
        raise SystemExit(EXIT_CONFIG) from None
    try:
        load_config("import-lsf output", text)
    except ConfigError as exc:  # e.g. a PROXYD_POLICIES that LSF would refuse as well
        click.echo(text, nl=False, err=True)
        for problem in exc.problems:
            click.echo(f"gridgate lsfproxyd import-lsf: {problem}", err=True)
        raise SystemExit(EXIT_CONFIG) from None
    click.echo(text, nl=False)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError as exc:
        click.echo(f"gridgate lsfproxyd import-lsf: cannot read {path}: {exc.strerror}", err=True)
        raise SystemExit(EXIT_CONFIG) from None


class Commands:
    """Adds ``gridgate lsfproxyd`` (entry point ``gridgate.cli: lsf_proxy``)."""

    @hookimpl
    def gridgate_register_commands(self, cli: click.Group) -> None:
        cli.add_command(lsfproxyd)
