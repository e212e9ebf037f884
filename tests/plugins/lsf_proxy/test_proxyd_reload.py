"""A re-read proxyd.yaml that is empty or cut short never replaces the policy in force."""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.request

import pytest
from support.polling import until

pytestmark = pytest.mark.timeout(300)

RECONFIG = b'{"v":1,"id":1,"op":"reconfig"}\n'
STATUS = b'{"v":1,"id":1,"op":"status"}\n'


def talk(path: str, line: bytes) -> dict:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(line)
        with sock.makefile("rb") as replies:
            return json.loads(replies.readline())


def status(path: str) -> dict:
    reply = talk(path, STATUS)
    assert reply["ok"], reply
    return reply["status"]


def site_text(socket_path: str) -> str:
    # the policy last, quoted: a cut inside it is a YAML error, a cut before it drops it
    return (
        "# the token daemon of this site\n"
        "proxyd:\n"
        f"  socket: {socket_path}\n"
        "  admins: [root, alice]\n"
        "  token_wait_time: 4\n"
        "  metrics_port: 0\n"
        "  policies: 'QUERY[max=2 nominal=1] SUBMISSION[max=3] OTHER[max=5]'\n"
    )


def limits(path: str) -> dict[str, int]:
    return {name: cat["token_limit"] for name, cat in status(path)["categories"].items()}


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("gridgate_proxyd_reloads_total")
    }


def test_empty_file_on_sighup_is_refused_logged_and_counted(start_daemon):
    d = start_daemon({"policies": "QUERY[max=2]", "metrics_port": 0})
    good = d.config.read_text()
    assert limits(d.socket)["query"] == 2
    d.config.write_text("")
    os.kill(d.pid, signal.SIGHUP)
    # a reconfig after the SIGHUP: its answer comes once the SIGHUP was handled
    refused = talk(d.socket, RECONFIG)
    assert limits(d.socket)["query"] == 2  # not the default 100
    assert refused["error"]["code"] == "bad_config" and "empty file" in refused["error"]["message"]
    assert status(d.socket)["reloads"]["refused"] == 2
    assert "empty file" in status(d.socket)["reloads"]["last_refusal"]
    log = d.log()
    assert log.count("config refused (1 so far)") == 1 and "empty file" in log, log
    assert log.count("config refused (2 so far)") == 1, log
    assert "Traceback" not in log
    # comments only is an empty document too
    d.config.write_text("# nothing here yet\n")
    os.kill(d.pid, signal.SIGHUP)
    assert until(lambda: status(d.socket)["reloads"]["refused"] == 3)
    assert "empty config" in status(d.socket)["reloads"]["last_refusal"]
    # a file without its proxyd: section is refused too
    d.config.write_text("notifiers:\n  log: {}\n")
    os.kill(d.pid, signal.SIGHUP)
    assert until(lambda: status(d.socket)["reloads"]["refused"] == 4)
    assert "no proxyd: section" in status(d.socket)["reloads"]["last_refusal"]
    assert limits(d.socket)["query"] == 2
    metrics = scrape(d.info["metrics_port"])
    assert metrics['gridgate_proxyd_reloads_total{result="refused"}'] == 4
    assert metrics['gridgate_proxyd_reloads_total{result="accepted"}'] == 0
    # the good file again: accepted and counted
    d.config.write_text(good.replace("max=2", "max=4"))
    os.kill(d.pid, signal.SIGHUP)
    assert until(lambda: limits(d.socket)["query"] == 4)
    assert status(d.socket)["reloads"]["accepted"] == 1
    assert scrape(d.info["metrics_port"])['gridgate_proxyd_reloads_total{result="accepted"}'] == 1


def test_a_file_cut_at_any_byte_never_resets_the_policy(start_daemon, sockdir):
    d = start_daemon({"policies": "QUERY[max=2]"})
    text = site_text(d.socket)
    d.config.write_text(text)
    assert talk(d.socket, RECONFIG)["ok"]
    before = status(d.socket)
    assert limits(d.socket) == {"query": 2, "submission": 3, "other": 5}
    accepted = []
    for cut in range(len(text)):
        d.config.write_text(text[:cut])
        reply = talk(d.socket, RECONFIG)
        if reply["ok"]:
            accepted.append(cut)
        else:
            assert reply["error"]["code"] == "bad_config", reply
        assert limits(d.socket) == {"query": 2, "submission": 3, "other": 5}, (cut, text[:cut])
    after = status(d.socket)
    # every cut is refused, the file without its final newline too (a cut there cannot be
    # told from a cut inside a value: see the next test)
    assert accepted == [], [repr(text[:c]) for c in accepted]
    assert after["reloads"]["refused"] == len(text)
    assert after["reloads"]["accepted"] == before["reloads"]["accepted"]
    print(json.dumps({"cut_points": len(text), "refused": len(text), "accepted": 0}))


def test_a_file_cut_inside_a_number_is_refused(start_daemon):
    """``token_wait_time: 40`` cut to ``token_wait_time: 4`` is valid YAML and a valid config:
    only the missing final newline says it was cut (issue 21, item 10's class, in the daemon)."""
    d = start_daemon({"policies": "QUERY[max=2]", "token_wait_time": 40})
    text = d.config.read_text()
    assert text.endswith("token_wait_time: 40\n"), text
    d.config.write_text(text[:-2])  # "...token_wait_time: 4"
    reply = talk(d.socket, RECONFIG)
    assert not reply["ok"] and reply["error"]["code"] == "bad_config", reply
    assert "no newline" in json.dumps(reply)
    assert (
        status(d.socket)["reloads"]["refused"] == 1 and status(d.socket)["reloads"]["accepted"] == 0
    )


def test_a_reload_that_lowers_a_limit_says_so_and_what_it_means_for_the_held_tokens(
    start_daemon, gridgate_exe, sockdir
):
    """Issue 31, item 9: a reload that lowers a category's max (with more tokens held than the
    new max) is a warning naming the category, the limits and the held tokens; the held
    tokens stay, new grants wait."""
    import subprocess
    import sys

    d = start_daemon({"policies": "QUERY[max=4 nominal=4] SUBMISSION[max=3]"})
    hold = (
        "import sys, time\n"
        "from gridgate.plugins.lsf_proxy.client.client import Daemon, ProxyClient\n"
        "client = ProxyClient([Daemon('unix', sys.argv[1])], user='nobody')\n"
        "tokens = [client.acquire('query', 'bjobs') for _ in range(3)]\n"
        "print('held', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, d.socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        d.config.write_text(
            d.config.read_text().replace("QUERY[max=4 nominal=4]", "QUERY[max=2 nominal=1]")
        )
        reply = talk(d.socket, RECONFIG)
        assert reply["ok"], reply
        assert limits(d.socket)["query"] == 2
        log = d.log()
        assert "proxyd reload: query max lowered from 4 to 2; 3 token(s) are held now" in log
        assert "query nominal lowered from 4 to 1" in log
        assert "submission" not in log.split("proxyd reload:", 1)[1].split("\n")[0]
    finally:
        holder.kill()
        holder.wait(10)
