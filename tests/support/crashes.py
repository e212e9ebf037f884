"""The crash-consistency kit (issue 41): a real `gridgate run` killed at a seeded random moment
while it submits, restarted, and what the CE holds compared with what the registry knows.

A backend's test gives the kit its site (a config document), and a function listing the jobs
the CE holds (``job id -> (job name, state)``, read with the scheduler's own client, not through
gridgate). The verdict of a run counts what issue 41 names: jobs on the CE of this fleet the
registry does not have (*unknown*), live pilots the registry tracks that the CE does not hold
(*phantom*), jobs waiting on the CE past ``max_waiting`` (*over*), job ids in two accounting
rows (*duplicate rows*), and whether the director ended with a traceback (*crash*).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gridgate.core.config import validate_document
from gridgate.core.engine.intents import fleet_of
from gridgate.core.engine.runtime import ACCOUNTING
from gridgate.core.state import open_state

BIN = Path(sys.executable).parent
#: Where the seeded moments are drawn: 0.1 to 5 s into the run, as issue 41's runs did.
FIRST, LAST = 0.1, 5.0


def seeds(ci: tuple[int, ...]) -> tuple[int, ...]:
    """The seeds of one fault's runs: ``ci`` in the suite; ``GRIDGATE_CRASH_RUNS`` of them
    (bench/bench_crashes.py sets 10) when set."""
    runs = int(os.environ.get("GRIDGATE_CRASH_RUNS") or 0)
    return tuple(41 + 1000 * i for i in range(runs)) if runs else ci


#: job id -> (job name, state as the CE says it: PENDING, PREPARING...)
Jobs = Mapping[str, tuple[str, str]]


@dataclass
class Verdict:
    """What one run came to (see the module's docstring)."""

    unknown: list[str] = field(default_factory=list)
    phantom: list[str] = field(default_factory=list)
    over: int = 0
    duplicate_rows: list[str] = field(default_factory=list)
    crash: str = ""
    killed_at: float = 0.0
    intents_left: int = 0

    def clean(self) -> bool:
        return not (self.unknown or self.phantom or self.over or self.duplicate_rows or self.crash)

    def row(self) -> dict[str, Any]:
        return {
            "unknown": len(self.unknown),
            "phantom": len(self.phantom),
            "over": self.over,
            "duplicate_rows": len(self.duplicate_rows),
            "crash": bool(self.crash),
            "killed_at": round(self.killed_at, 3),
        }


class Run:
    """A director on ``doc`` (a config document) in ``folder``: started, killed, restarted,
    judged. ``waiting_states`` are the CE's words for a job that waits (counted against
    ``max_waiting``); ``base`` the backend's ``job_name``."""

    def __init__(
        self,
        folder: Path,
        doc: dict[str, Any],
        ce_jobs: Callable[[], Jobs],
        *,
        base: str,
        waiting_states: frozenset[str],
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        self.folder = folder
        #: what the director is run under (setpriv as the cell's submit user)
        self.prefix = list(prefix)
        self.doc = doc
        self.ce_jobs = ce_jobs
        self.base = base
        self.waiting_states = waiting_states
        self.env = {**os.environ, **(env or {})}
        self.path = folder / "site.yaml"
        folder.mkdir(parents=True, exist_ok=True)
        self.path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        self.state_dir = Path(doc["director"]["state_dir"])
        self.logs: list[Path] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_over = 0

    # --- the director ----------------------------------------------------------------------

    def start(self) -> subprocess.Popen[bytes]:
        log = self.folder / f"director-{len(self.logs)}.log"
        self.logs.append(log)
        with open(log, "wb") as sink:
            self.proc = subprocess.Popen(
                [*self.prefix, str(BIN / "gridgate"), "run", "-c", str(self.path)],
                cwd=self.folder,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        return self.proc

    def wait_for_intent(
        self, rng: random.Random, bound: float = 60.0, into: tuple[float, float] = (0.0, 0.15)
    ) -> float:
        """Until a submission is in flight (an intent on disk), then a seeded ``into`` s more:
        the seconds since this was called."""
        assert self.proc is not None
        started = time.monotonic()
        delay = rng.uniform(*into)
        intents = self.state_dir / "intents"
        while time.monotonic() < started + bound:
            if self.proc.poll() is not None:
                raise AssertionError(f"the director ended by itself: {self.log_text()[-2000:]}")
            try:
                if any(p.suffix == ".json" for p in intents.iterdir()):
                    time.sleep(delay)
                    return time.monotonic() - started
            except FileNotFoundError:
                pass
            time.sleep(0.001)
        raise AssertionError(f"no submission in flight within {bound} s")

    def kill_during_submission(
        self,
        rng: random.Random,
        bound: float = 60.0,
        window: tuple[float, float] = (FIRST, LAST),
        into: tuple[float, float] = (0.0, 0.15),
    ) -> float:
        """SIGKILL the director at a seeded moment of its run (in ``window`` s), when a
        submission is in flight there (an intent on disk), a random ``into`` s into it: the
        seconds since start it was killed at. A site whose director submits only at its start
        (long pilots) gives ``window=(0, 0)`` and a wider ``into``."""
        assert self.proc is not None
        started = time.monotonic()
        time.sleep(rng.uniform(*window))
        self.wait_for_intent(rng, bound, into)
        killed = time.monotonic() - started
        self.proc.send_signal(signal.SIGKILL)  # the director alone: what it ran goes on
        self.proc.wait(30)
        self.sweep(self.proc.pid)
        return killed

    @staticmethod
    def sweep(group: int, bound: float = 20.0) -> None:
        """Let what a killed director ran end by itself (an sbatch finishing its request),
        then kill what is left of its process group."""
        end = time.monotonic() + bound
        while time.monotonic() < end:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait: the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(30)

    def log_text(self) -> str:
        return "\n".join(p.read_text("utf-8", "replace") for p in self.logs if p.exists())

    def iterations(self) -> int:
        """Iterations run on the store (every director of it)."""
        state = self.open()
        try:
            value = state.get("director/iterations")
        finally:
            state.close()
        return int(value or 0)

    def wait_iterations(self, more: int, bound: float = 120.0) -> None:
        """Until ``more`` iterations past the current count were run, watching the CE's
        waiting jobs meanwhile (their peak over ``max_waiting`` is kept)."""
        target = self.iterations() + more
        end = time.monotonic() + bound
        while time.monotonic() < end:
            self.watch()
            if self.iterations() >= target:
                return
            assert self.proc is None or self.proc.poll() is None, self.log_text()[-3000:]
            time.sleep(0.25)
        raise AssertionError(
            f"{more} iterations not run within {bound} s: {self.log_text()[-3000:]}"
        )

    # --- what is where ----------------------------------------------------------------------

    def open(self) -> Any:
        return open_state(validate_document(self.doc).data)

    def max_waiting(self) -> int:
        return int(self.doc["director"].get("pilots", {}).get("max_waiting", 10))

    def endpoints(self) -> int:
        return 1

    def fleet_jobs(self) -> Jobs:
        """The CE's jobs named by this site's directors (their fleet: a job of an earlier
        run, still being cleaned, is not this run's)."""
        config = validate_document(self.doc)  # with its defaults, as the director reads it
        fleet = config.director.get("fleet") or fleet_of(config, config.director["state_dir"])
        prefix = f"{self.base}-{fleet}-"
        return {j: (n, s) for j, (n, s) in self.ce_jobs().items() if n.startswith(prefix)}

    def watch(self) -> None:
        waiting = sum(1 for _n, s in self.fleet_jobs().values() if s in self.waiting_states)
        self.peak_over = max(self.peak_over, waiting - self.max_waiting() * self.endpoints())

    def verdict(self, killed_at: float = 0.0) -> Verdict:
        """The comparison, now."""
        state = self.open()
        try:
            registry = state.pilot_registry()
            pilots = {p.job_id: p for p in registry.query(registry_backend(self.doc))}
            rows = state.records(ACCOUNTING)
        finally:
            state.close()
        ce = self.fleet_jobs()
        known = set(pilots)
        unknown = sorted(j for j in ce if j not in known)
        phantom = sorted(j for j, p in pilots.items() if not p.terminal and j not in ce)
        seen: dict[str, int] = {}
        for row in rows:
            for job in row.get("job_ids") or ():
                seen[job] = seen.get(job, 0) + 1
        duplicates = sorted(j for j, n in seen.items() if n > 1)
        text = self.log_text()
        crash = (
            "Traceback (most recent call last)"
            if "Traceback (most recent call last)" in text
            else ""
        )
        intents = self.state_dir / "intents"
        left = len(list(intents.glob("*.json"))) if intents.is_dir() else 0
        return Verdict(
            unknown=unknown,
            phantom=phantom,
            over=max(0, self.peak_over),
            duplicate_rows=duplicates,
            crash=crash,
            killed_at=killed_at,
            intents_left=left,
        )


def restart_empty(server: Any) -> None:
    """Kill a :class:`support.redis_server.RedisServer` (no persistence) and start it again on
    the same port: it answers, and holds nothing."""
    proc = server.proc
    argv = list(proc.args)
    proc.kill()
    proc.wait(10)
    server.proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    assert server._wait_ready(), "redis-server did not start again"


def registry_backend(doc: Mapping[str, Any]) -> str:
    (backend,) = doc["backends"]
    return str(backend)


def record(name: str, rows: list[dict[str, Any]]) -> None:
    """Keep the runs' rows for docs/reliability.md (GRIDGATE_RELIABILITY_FIGURES names the
    file; nothing is written when it is unset)."""
    path = os.environ.get("GRIDGATE_RELIABILITY_FIGURES")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as sink:
        sink.write(json.dumps({"test": name, "runs": rows}) + "\n")
