"""``gridgate lsfproxyd import-lsf``: a site's lsf.conf and lsb.params as a proxyd: section."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from support.ports import free_port

from gridgate.core.config import load_config
from gridgate.plugins.lsf_proxy.cli.commands import lsfproxyd
from gridgate.plugins.lsf_proxy.config import Limits, resolve_policies

EXE = str(Path(sys.executable).parent / "gridgate")

LSF_CONF = """\
# LSF configuration of the cluster
LSF_MASTER_LIST="master1 master2"
LSF_PROXYD_HOSTS="proxy1 \\
proxy2"
LSF_PROXYD_PORT={port}   # lsfproxyd listens here
LSF_PROXYD_TOKEN_WAIT_TIME=10
LSF_PROXYD_NOTOKEN_NTRIES=3
LSF_PROXYD_HEARTBEAT_INTERVAL=25
LSF_ADDON_HOSTS='hosta hostb'
LSF_PROXYD_BYPASS=Y
LSF_DEBUG_PROXYD="LC_TRACE"
LSB_DEBUG_MBD="LC2_LSF_PROXYD"
"""

LSB_PARAMS = """\
# lsb.params
PROXYD_POLICIES = "QUERY[max=1]"   # outside the section: not LSF's, ignored
Begin Parameters
DEFAULT_QUEUE  = normal   #default job queue name
MBD_SLEEP_TIME = 10
MAX_CONCURRENT_QUERY = 80
PROXYD_POLICIES = "QUERY[max=80 nominal=40 throttle=2] \\
                   SUBMISSION[max=30] OTHER[nominal=120]"
ENABLE_DIAGNOSE = lsfproxyd
End Parameters
"""


def _files(
    tmp_path: Path, conf: str = LSF_CONF, params: str = LSB_PARAMS, port: int = 6881
) -> list[str]:
    (tmp_path / "lsf.conf").write_text(conf.replace("{port}", str(port)))
    (tmp_path / "lsb.params").write_text(params)
    return ["--lsf-conf", str(tmp_path / "lsf.conf"), "--lsb-params", str(tmp_path / "lsb.params")]


def _run(*args: str):
    return CliRunner().invoke(lsfproxyd, ["import-lsf", *args])


def test_real_syntax_becomes_a_validating_commented_section(tmp_path):
    result = _run(*_files(tmp_path))
    assert result.exit_code == 0, result.output
    out = tmp_path / "site.yaml"
    out.write_text(result.output)
    done = subprocess.run([EXE, "config", "validate", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    section = load_config(out)["proxyd"]
    assert section["hosts"] == [
        {"name": "proxy1", "address": "proxy1:6881"},
        {"name": "proxy2", "address": "proxy2:6881"},
    ]
    assert section["tcp"] == "0.0.0.0:6881" and section["key"] == {
        "file": "/etc/gridgate/proxyd.key"
    }
    assert (section["token_wait_time"], section["notoken_ntries"]) == (10, 3)
    assert section["addon_hosts"] == ["hosta", "hostb"]
    assert section["diagnose"] is True and section["max_concurrent_query"] == 80
    assert section["heartbeat_interval"] == 25  # between the daemons here (LSF: to mbatchd)
    limits = resolve_policies(section["policies"], section["max_concurrent_query"])
    assert limits["query"] == Limits(80, 40, 0.002)  # the section's, not the line before Begin
    assert limits["other"] == Limits(120, 120, 0.001)
    # every carried value says where it came from
    assert "# LSF_PROXYD_TOKEN_WAIT_TIME='10' (lsf.conf:6)" in result.output
    assert "(lsb.params:7)" in result.output  # PROXYD_POLICIES, continued on line 8
    # what cannot be carried over is named, with why
    carried_not = result.output.split("# Not carried over:")[1]
    for name in (
        "LSF_PROXYD_BYPASS='Y' (lsf.conf:10)",
        "LSF_DEBUG_PROXYD='LC_TRACE' (lsf.conf:11)",
        "LSB_DEBUG_MBD='LC2_LSF_PROXYD' (lsf.conf:12)",
    ):
        assert name in carried_not, carried_not
    assert "mbatchd" in carried_not
    assert "DEFAULT_QUEUE" not in result.output and "LSF_MASTER_LIST" not in result.output


def test_the_imported_section_serves(tmp_path, sockdir):
    port = free_port()
    key = sockdir / "proxyd.key"
    key.write_text("imported-key\n")
    key.chmod(0o600)
    result = _run(*_files(tmp_path, port=port), "--key-file", str(key))
    assert result.exit_code == 0, result.output
    config = sockdir / "site.yaml"
    config.write_text(result.output)
    proc = subprocess.Popen(
        [
            EXE,
            "lsfproxyd",
            "serve",
            "-c",
            str(config),
            "--name",
            "proxy1",
            "--socket",
            str(sockdir / "p.sock"),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        assert line and line[0], proc.stderr.read() if proc.poll() is not None else "no line"
        assert json.loads(line[0])["tcp_port"] == port
        out = subprocess.run(
            [EXE, "lsfproxyd", "status", "--socket", str(sockdir / "p.sock")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        # this daemon's share of QUERY[max=80] split over proxy1 and proxy2
        assert "QUERY      40" in out.stdout, out.stdout
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize(
    "conf, params, expected",
    [
        ('LSF_PROXYD_HOSTS="a b\n', "", 'lsf.conf:1: unclosed " quote'),
        ("LSF_PROXYD_PORT=seven\n", "", "lsf.conf:1: LSF_PROXYD_PORT='seven' is not a positive"),
        ("just words\n", "", "lsf.conf:1: expected NAME=value"),
        ("", "Begin Parameters\nMAX_CONCURRENT_QUERY=5\n", "Begin Parameters without End"),
        ("", "End Parameters\n", "lsb.params:1: 'End Parameters' without a Begin"),
        (
            "",
            'Begin Parameters\nMAX_CONCURRENT_QUERY=50\nPROXYD_POLICIES="QUERY[max=60]"\n'
            "End Parameters\n",
            "proxyd.policies.query.max: QUERY max (60) must not exceed",
        ),
        (
            "",
            'Begin Parameters\nPROXYD_POLICIES="QUERY[max=10 nominal=20]"\nEnd Parameters\n',
            "nominal (20) must not exceed max (10)",
        ),
    ],
)
def test_bad_files_are_errors_naming_file_and_line(tmp_path, conf, params, expected):
    result = _run(*_files(tmp_path, conf, params))
    assert result.exit_code == 2, result.output
    assert expected in result.output, result.output


def test_nothing_to_carry_over_still_validates(tmp_path):
    result = _run(*_files(tmp_path, "LSF_MASTER_LIST=m1\n", "Begin Parameters\nEnd Parameters\n"))
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output) == {"proxyd": {}}
    assert _run().exit_code == 2  # no file at all: a usage error
