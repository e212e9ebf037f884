"""``gridgate run`` as the unit starts it (issue 31, item 1; issue 32, item 2): a FIFO put in
place of the proxy no longer hangs the director before its first iteration; each iteration's
journal line says per backend what was asked, submitted and skipped, and why; SIGTERM ends
the director within ``director.stop_timeout`` whatever it is blocked in. Real ``gridgate``
processes, the stand-in gLite commands, a real redis-server stopped with SIGSTOP."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from support.redis_server import RedisServer
from support.wms_site import director_section, healthy_wms

from gridgate.core.devkit.services import free_port


def site(folder: Path, **more: Any) -> Path:
    """A director on a stand-in WMS that accepts every pilot, beside an ARC CE that needs the
    proxy (nothing listens at its address: with the credential unusable, it is never asked)."""
    pilot = folder / "pilot.sh"
    pilot.write_text("#!/bin/sh\necho pilot\n", encoding="utf-8")
    doc: dict[str, Any] = {
        "director": director_section(folder, 0.2),
        "state": {"driver": "memory"},
        "backends": {
            "wms_glite": healthy_wms(folder),
            "arc": {
                "endpoints": [f"https://127.0.0.1:{free_port()}/arex"],
                "script": str(pilot),
            },
        },
        "demand": {"static": {"wms_glite": 1, "arc": 5}},
    }
    for key, value in more.items():
        doc[key] = {**doc.get(key, {}), **value}
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def start(gridgate_exe: str, config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [gridgate_exe, "-v", "run", "-c", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )


#: an iteration line written anywhere but the journal: its local time first, as the log's
STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d iteration \d+: ")


def lines_until(proc: subprocess.Popen[str], count: int, deadline: float = 120) -> list[str]:
    """The first ``count`` lines of ``proc``'s stdout, read under a deadline."""
    assert proc.stdout is not None
    got: list[str] = []
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        end = time.monotonic() + deadline
        while len(got) < count and time.monotonic() < end:
            if sel.select(timeout=1):
                line = proc.stdout.readline()
                if not line:
                    break
                got.append(line.rstrip("\n"))
    return got


def test_a_fifo_proxy_is_an_unusable_credential_the_iterations_go_on_and_sigterm_ends_it(
    gridgate_exe: str, tmp_path: Path
) -> None:
    fifo = tmp_path / "proxy.pem"
    os.mkfifo(fifo, 0o600)
    config = site(tmp_path, credentials={"x509_proxy": {"path": str(fifo), "renew": []}})
    proc = start(gridgate_exe, config)
    try:
        lines = lines_until(proc, 3)
        assert len(lines) == 3, (lines, proc.poll())
        for line in lines:
            assert STAMPED.match(line), line  # off the journal: its time first
            # what was asked, what was done and why arc gave nothing, on the line itself
            assert "arc: demand 5, waiting 0, submitted 0, skipped 5 (credential)" in line
            assert "wms_glite: demand 1" in line
            assert (
                f"credential x509_proxy (x509) unusable, arc waiting: X.509 proxy {fifo} is a FIFO"
                in line
            )
        assert re.search(r"wms_glite: demand 1, waiting \d+, submitted 1", lines[0]), lines[0]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "signal 15 received" in err and "did not stop" not in err


def test_sigterm_ends_a_director_blocked_in_a_store_that_stopped_answering(
    gridgate_exe: str, tmp_path: Path
) -> None:
    """Redis stopped with SIGSTOP, a long socket_timeout: the iteration waits in a read that
    only the timeout would end; stop_timeout bounds the stop and the log says where it was."""
    server = RedisServer(tmp_path / "redis").start()
    assert server.proc is not None
    try:
        config = site(
            tmp_path,
            state={"driver": "redis", "url": server.url, "socket_timeout": 3600},
            director={"stop_timeout": 2},
        )
        proc = start(gridgate_exe, config)
        try:
            assert len(lines_until(proc, 1)) == 1
            server.proc.send_signal(signal.SIGSTOP)
            time.sleep(1.0)  # the next iteration is now inside a Redis call
            asked = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=120)
            took = time.monotonic() - asked
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        server.proc.send_signal(signal.SIGCONT)
        server.stop()
    assert proc.returncode == 1, err
    assert "did not stop within stop_timeout (2 s) and exits anyway" in err
    assert "redis" in err.split("it was still in:")[1].lower()
    # no assertion on wall time: the exit came, where socket_timeout alone would take an hour
    print(f"stopped {took:.1f} s after SIGTERM")


def _expired_proxy(path: Path, hours_ago: float) -> None:
    """A certificate and key as a proxy file holds them, its end ``hours_ago`` in the past."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "robot")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(hours=hours_ago + 12))
        .not_valid_after(now - datetime.timedelta(hours=hours_ago))
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def test_the_journal_line_of_an_expired_proxy_says_what_was_asked_and_why_nothing_went(
    gridgate_exe: str, tmp_path: Path
) -> None:
    proxy = tmp_path / "x509up"
    _expired_proxy(proxy, hours_ago=2)
    config = site(tmp_path, credentials={"x509_proxy": {"path": str(proxy), "renew": []}})
    done = subprocess.run(
        [gridgate_exe, "-v", "run", "--once", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    [line] = [x for x in done.stdout.splitlines() if STAMPED.match(x)]
    assert "arc: demand 5, waiting 0, submitted 0, skipped 5 (credential)" in line, line
    assert re.search(r"wms_glite: demand 1, waiting \d+, submitted 1", line), line
    assert (
        f"credential x509_proxy (x509) unusable, arc waiting: X.509 proxy {proxy} expired at "
        in line
    ), line
    assert "no renew command is configured" in line, line
    assert not line.rstrip().endswith(","), line


def test_an_iteration_line_has_its_time_off_the_journal_and_none_on_it(
    gridgate_exe: str, tmp_path: Path
) -> None:
    """Issue 42: the journal stamps each line, a file or a terminal does not: off journald the
    iteration lines carried no time while the log lines beside them did. Under systemd,
    JOURNAL_STREAM names the device and inode of the unit's stdout."""
    config = site(tmp_path)
    for name, journal in (("file.out", False), ("journal.out", True)):
        out = tmp_path / name
        with open(out, "w", encoding="utf-8") as sink:
            info = os.fstat(sink.fileno())
            env = {**os.environ, "PATH": "/usr/bin:/bin"}
            if journal:
                env["JOURNAL_STREAM"] = f"{info.st_dev}:{info.st_ino}"
            done = subprocess.run(
                [gridgate_exe, "run", "--once", "-c", str(config)],
                stdout=sink,
                stderr=subprocess.PIPE,
                text=True,
                timeout=120,
                env=env,
            )
        assert done.returncode == 0, done.stderr
        [line] = [x for x in out.read_text().splitlines() if "iteration 1:" in x]
        if journal:
            assert line.startswith("iteration 1: "), line
        else:
            assert STAMPED.match(line) and not line.startswith("iteration"), line


def test_a_memory_store_empty_at_the_next_start_is_not_a_store_that_lost_its_data(
    gridgate_exe: str, tmp_path: Path
) -> None:
    """`state: memory` lives and dies with the director: the epoch the last run kept in its
    state folder made every start after the first say "the state store came back empty" (an
    error, and a mail), and search the CEs for the pilots of a store that never kept any."""
    from support.wms_site import director_site, fake_jwt

    token = tmp_path / "token"
    token.write_text(fake_jwt(time.time() + 3600) + "\n")
    token.chmod(0o600)
    config = director_site(tmp_path, 0, token)
    doc = yaml.safe_load(config.read_text(encoding="utf-8"))
    del doc["director"]["metrics_port"]
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    for _run in range(2):
        done = subprocess.run(
            [gridgate_exe, "-v", "run", "--once", "-c", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stderr
        assert "came back empty" not in done.stderr, done.stderr
