"""The ``proxyd:`` section through the site config loader: both policy forms, clear errors."""

from __future__ import annotations

import pytest

from gridgate.core.config import ConfigError, load_config
from gridgate.plugins.lsf_proxy.config import Limits, resolve_policies


def load(write, text: str):
    return load_config(write("site.yaml", text))


def problems(write, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(write, text)
    return [str(p) for p in info.value.problems]


def test_lsf_string_pasted_verbatim(write):
    config = load(
        write,
        'proxyd:\n  policies: "QUERY[max=100 nominal=50 throttle=1] '
        'SUBMISSION[max=100] OTHER[max=100]"\n',
    )
    section = config["proxyd"]
    assert section["token_wait_time"] == 15 and section["admins"] == ["root"]
    assert section["diagnose"] is False and section["hosts"] == []
    assert resolve_policies(section["policies"])["query"] == Limits(100, 50, 0.001)


def test_mapping_per_category(write):
    config = load(write, "proxyd:\n  policies:\n    query: {max: 200}\n    other: {nominal: 150}\n")
    limits = resolve_policies(config["proxyd"]["policies"])
    assert limits["query"] == Limits(200, 50, 0.001)
    assert limits["other"] == Limits(150, 150, 0.001)
    assert limits["submission"] == Limits(100, 50, 0.001)


def test_errors_name_file_line_and_field(write):
    path = write(
        "site.yaml",
        "proxyd:\n  admins: [root]\n  policies:\n    query:\n      max: 10\n      nominal: 20\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert [str(p) for p in info.value.problems] == [
        f"{path}:6: proxyd.policies.query.nominal: nominal (20) must not exceed max (10)"
    ]


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            "  policies: 'QUERY[max=10 nominal=20]'\n",
            "proxyd.policies.query.nominal: nominal (20) must not exceed max (10)",
        ),
        (
            "  policies: 'QUERY[max=-1]'\n",
            "proxyd.policies.query.max: max must be a positive integer",
        ),
        ("  policies: 'QUEUE[max=1]'\n", "proxyd.policies: unknown category 'QUEUE'"),
        (
            "  policies: {query: {max: 0}}\n",
            "proxyd.policies.query.max: max must be a positive integer",
        ),
        ("  policies: {query: {speed: 1}}\n", "proxyd.policies"),
        ("  tcp: '0.0.0.0:7000'\n", "proxyd.tcp: TCP needs a shared key"),
        (
            "  hosts: [{name: a, address: /x.sock}, {name: a, address: /y.sock}]\n",
            "proxyd.hosts[1].name: host name 'a' is listed twice",
        ),
        (
            "  hosts: [{name: a, address: nowhere}]\n",
            "proxyd.hosts[0].address: 'nowhere' is neither",
        ),
        (
            "  hosts: [{name: a, address: 'h1:7000'}]\n",
            "proxyd.hosts[0].address: a TCP address needs",
        ),
        ("  token_wait_time: 0\n", "proxyd.token_wait_time:"),
        ("  wait: 3\n", "proxyd.wait: unknown key"),
    ],
)
def test_bad_sections(write, body, expected):
    found = problems(write, "proxyd:\n" + body)
    assert any(expected in p for p in found), found
    assert all(":2: " in p for p in found), found


def test_good_tcp_and_hosts(write):
    config = load(
        write,
        "proxyd:\n  tcp: '127.0.0.1:7000'\n  key: {env: PROXYD_KEY}\n"
        "  hosts:\n    - {name: a, address: 'h1:7000'}\n"
        "    - {name: b, address: /run/b.sock}\n",
    )
    assert [h["name"] for h in config["proxyd"]["hosts"]] == ["a", "b"]


def test_config_validate_command(write):
    good = write("good.yaml", "proxyd:\n  policies: 'SUBMISSION[max=30]'\n")
    bad = write("bad.yaml", "proxyd:\n  policies: 'SUBMISSION[max=30 nominal=31]'\n")
    import subprocess
    import sys
    from pathlib import Path

    exe = str(Path(sys.executable).parent / "gridgate")
    assert (
        subprocess.run([exe, "config", "validate", str(good)], capture_output=True).returncode == 0
    )
    out = subprocess.run([exe, "config", "validate", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2
    assert (
        f"{bad}:2: proxyd.policies.submission.nominal: nominal (31) must not exceed max (30)"
        in out.stderr
    )


def test_gridgate_register_commands_adds_the_lsfproxyd_group():
    import click

    from gridgate.core.engine.loader import cli_plugin_manager

    group = click.Group("gridgate")
    errors = []
    pm = cli_plugin_manager(on_error=errors.append)
    pm.hook.gridgate_register_commands(cli=group)
    assert not [e for e in errors if e.name == "lsf_proxy"]
    proxyd = group.commands["lsfproxyd"]
    assert set(proxyd.commands) == {
        "serve",
        "status",
        "enable",
        "disable",
        "block",
        "unblock",
        "blocklist",
        "diagnose",
        "reconfig",
        "import-lsf",
    }
    for command in proxyd.commands.values():
        if command.name == "import-lsf":
            continue  # converts files offline: no daemon to reach, no config to read
        options = {opt for param in command.params for opt in getattr(param, "opts", [])}
        assert {"--json", "--socket", "-c", "--config"} <= options, command.name


def test_query_max_is_bounded_by_max_concurrent_query(write):
    """The seed: QUERY max is any positive integer <= MAX_CONCURRENT_QUERY."""
    found = problems(
        write,
        "proxyd:\n  max_concurrent_query: 50\n  policies: 'QUERY[max=60] SUBMISSION[max=200]'\n",
    )
    assert any(
        ":3: proxyd.policies.query.max: QUERY max (60) must not exceed "
        "max_concurrent_query (50, MAX_CONCURRENT_QUERY)" in p
        for p in found
    ), found
    # at the bound, and for the other categories (no bound), fine
    config = load(
        write,
        "proxyd:\n  max_concurrent_query: 50\n  policies: 'QUERY[max=50] SUBMISSION[max=200]'\n",
    )
    assert resolve_policies(config["proxyd"]["policies"], 50)["query"].max == 50
    # unset QUERY max: the seed's default 100 is cut to the bound, nominal follows (< 50 rule)
    assert resolve_policies("SUBMISSION[max=3]", 30)["query"] == Limits(30, 30, 0.001)
    assert resolve_policies("", 500)["query"] == Limits(100, 50, 0.001)
    found = problems(
        write, "proxyd:\n  max_concurrent_query: 20\n  policies: {query: {nominal: 40}}\n"
    )
    assert any(
        "proxyd.policies.query.nominal: nominal (40) must not exceed max (20)" in p for p in found
    ), found


def test_bypass_keys_without_a_scheduler_are_errors_naming_both(write):
    # before: accepted, and no audit ever ran (no scheduler, no BypassWatch)
    found = problems(
        write,
        "proxyd:\n  bypass:\n    audit:\n      interval: 30\n    action: block\n",
    )
    assert len(found) == 2, found
    assert "/site.yaml:4: proxyd.bypass.audit.interval: set, but " in found[0]
    assert "/site.yaml:5: proxyd.bypass.action: set, but " in found[1]
    for text in found:
        assert "proxyd.bypass.scheduler is not: nothing reads it" in text


def test_scheduler_options_without_scheduler_serve_only_an_sdiag_adaptive_limit(write):
    # proxyd.adaptive's source sdiag reads slurm with bypass.scheduler_options and the audit's
    # timeout: no error then
    options = "  bypass:\n    scheduler_options: {env: {SLURM_CONF: /x}}\n    audit: {timeout: 3}\n"
    load(write, f"proxyd:\n{options}  adaptive:\n    query: {{source: sdiag}}\n")
    [alone, timeout] = problems(write, f"proxyd:\n{options}")
    assert "/site.yaml:3: proxyd.bypass.scheduler_options: set, but " in alone
    assert "(or a proxyd.adaptive entry with source: sdiag)" in alone
    assert "/site.yaml:4: proxyd.bypass.audit.timeout: set, but " in timeout
    [tokens] = problems(
        write,
        "proxyd:\n  bypass:\n    scheduler_options: {env: {}}\n"
        "  adaptive:\n    query: {source: tokens}\n",
    )
    assert "/site.yaml:3: proxyd.bypass.scheduler_options: set, but " in tokens


def test_a_bypass_block_with_its_scheduler_is_fine(write):
    load(write, "proxyd:\n  bypass:\n    scheduler: slurm\n    action: block\n    for: 30m\n")
