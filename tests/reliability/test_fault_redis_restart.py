"""Fault row: Redis restarted (and emptied: no persistence) under two running directors."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from relkit import HOSTS, Site, wait_for
from support import redis_server
from support.redis_server import RedisServer

UNAVAILABLE = "gridgate: state store unavailable, running on a local view"
BACK = "gridgate: state store available again"


def _subjects(folder: Path) -> list[str]:
    return (
        [
            p.read_text().splitlines()[0].removeprefix("Subject: ")
            for p in sorted(folder.glob("*.txt"))
        ]
        if folder.exists()
        else []
    )


@pytest.mark.timeout(150)
def test_redis_restart_under_two_directors(
    tmp_path: Path, gridgate_exe: str, director_procs: list, monkeypatch, figures
) -> None:
    site = Site(tmp_path / "site", hosts=HOSTS[:3])
    site.scenario(hosts={HOSTS[0]: {"behaviour": "error"}}, log_calls=False)
    server = RedisServer(tmp_path / "redis").start()
    try:
        configs = []
        for name in ("a", "b"):
            doc = site.doc(
                cycle_seconds=0.2,
                failing_expiry=600,
                ticket_expiry=600,
                state_retry_seconds=0.3,
                state_dir=str(tmp_path / name),
            )
            doc["state"] = {
                "driver": "redis",
                "url": server.url,
                "prefix": "rel:",
                "socket_timeout": 2,
                "socket_connect_timeout": 2,
            }
            doc["demand"] = {"static": {"wms_glite": 6}}
            doc["notifiers"]["files"]["levels"] = ["error", "alarm", "info"]
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(doc), encoding="utf-8")
            configs.append(path)
        errs = [(tmp_path / f"{n}.err") for n in ("a", "b")]
        outs = [(tmp_path / f"{n}.jsonl") for n in ("a", "b")]
        for config, out, err in zip(configs, outs, errs, strict=True):
            with err.open("w") as sink, out.open("w") as sink_out:
                director_procs.append(
                    subprocess.Popen(
                        [gridgate_exe, "run", "-c", str(config), "--json"],
                        stdout=sink_out,
                        stderr=sink,
                    )
                )

        def done() -> list[int]:
            return [
                sum(1 for line in out.read_text().splitlines() if line.endswith("}"))
                for out in outs
            ]

        client = server.client()
        wait_for(
            lambda: (
                client.get(f"rel:failing/wms_glite/{HOSTS[0]}") is not None
                or any(k for k in client.keys("rel:*failing*"))
            ),
            60,
            "the failing server to enter the shared failing cache",
        )
        client.close()
        # Steady state first: each director has read the shared failing cache at least once.
        seen = done()
        wait_for(
            lambda: all(n >= m + 2 for n, m in zip(done(), seen, strict=True)),
            60,
            "two more iterations of each director",
        )
        notes_before = _subjects(site.notes)

        # Redis goes away for a while, then comes back empty on the same port.
        port = server.port
        server.stop()
        wait_for(
            lambda: _subjects(site.notes).count(UNAVAILABLE) == 2,
            60,
            "both directors to notice the outage",
        )
        at_outage = done()
        wait_for(
            lambda: all(n >= m + 8 for n, m in zip(done(), at_outage, strict=True)),
            60,
            "eight iterations of each director on its local view",
        )
        outage_iterations = [n - m for n, m in zip(done(), at_outage, strict=True)]
        monkeypatch.setattr(redis_server, "free_port", lambda: port)
        server = RedisServer(tmp_path / "redis").start()
        wait_for(
            lambda: _subjects(site.notes).count(BACK) == 2, 60, "both directors to resynchronise"
        )
        for proc in director_procs:
            assert proc.poll() is None, "a director died"
        # A few more iterations on the restored store.
        client = server.client()
        wait_for(
            lambda: any(k for k in client.keys("rel:*failing*")),
            30,
            "the failing cache to be written back",
        )
        client.close()
        for proc in director_procs:
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in director_procs]
    finally:
        server.stop()
    assert codes == [0, 0]
    for err in errs:
        assert "Traceback" not in err.read_text()
    subjects = _subjects(site.notes)
    about_host = [s for s in subjects if HOSTS[0] in s]
    assert len(about_host) == 1, subjects  # one error for the whole episode, outage included
    figures(
        outage_iterations=outage_iterations,
        notes_before=len(notes_before),
        notes=len(subjects),
        about_failing_server=len(about_host),
        outage_notes=subjects.count(UNAVAILABLE),
        back_notes=subjects.count(BACK),
    )
