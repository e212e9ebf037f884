"""The command runner against real processes: deadlines, process-group kills, capped output."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import pytest
from support.proctable import alive, live_descendants, live_in_group, processes_with

from gridgate.core.backend import Backend, command_timeout_schema
from gridgate.core.clock import FakeClock
from gridgate.core.model import Endpoint, SubmitRequest, SubmitResult
from gridgate.core.runner import DRAIN_AFTER_EXIT, kill_process_group, run
from gridgate.core.testing import build_plugin, director_for, stand_in_command

PY = sys.executable
# Generous slack for a loaded 2-core machine: this bounds behaviour (no waiting for a
# grandchild's 1000 s), it is not a speed measurement.
SLACK = 10.0


@pytest.fixture(autouse=True)
def no_leftover_children():
    """Every test here must leave no child process of its own running."""
    before = live_descendants(os.getpid())
    yield
    left = live_descendants(os.getpid()) - before
    assert not left, f"test left child processes running: {sorted(left)}"


def test_success_with_output():
    r = run(["sh", "-c", "echo hello; echo warn >&2"], 5)
    assert r.ok
    assert r.returncode == 0
    assert r.stdout == "hello\n"
    assert r.stderr == "warn\n"
    assert not r.timed_out and r.launch_error is None
    assert not r.stdout_truncated and not r.stderr_truncated
    assert r.argv == ("sh", "-c", "echo hello; echo warn >&2")
    assert r.duration >= 0


def test_nonzero_exit():
    r = run(["sh", "-c", "echo partial; exit 7"], 5)
    assert r.returncode == 7
    assert not r.ok
    assert r.stdout == "partial\n"
    assert r.describe() == "exit code 7"


def test_killed_by_signal_reports_negative_code():
    r = run(["sh", "-c", "kill -9 $$"], 5)
    assert r.returncode == -signal.SIGKILL
    assert not r.timed_out


def test_stdin_input_small_and_large():
    assert run(["cat"], 5, input=b"abc\n").stdout == "abc\n"
    # Larger than any pipe buffer: stdin must be written while stdout is read.
    big = b"0123456789abcdef" * (256 * 1024)
    r = run(["cat"], 20, input=big, max_output=len(big))
    assert r.returncode == 0
    assert r.stdout.encode() == big
    assert not r.stdout_truncated


def test_child_not_reading_stdin_does_not_block():
    r = run(["true"], 5, input=b"x" * (1024 * 1024))
    assert r.returncode == 0


def test_env_and_cwd(tmp_path):
    r = run(
        ["sh", "-c", 'echo "$GG_VAR"; pwd'],
        5,
        env={"GG_VAR": "v1", "PATH": os.environ["PATH"]},
        cwd=tmp_path,
    )
    assert r.stdout.splitlines() == ["v1", str(tmp_path.resolve())]


def test_prints_then_hangs_keeps_partial_output():
    r = run(["sh", "-c", "echo before; echo err-before >&2; exec sleep 1000"], 0.5, kill_grace=0.5)
    assert r.timed_out
    assert r.returncode is None
    assert r.stdout == "before\n"
    assert r.stderr == "err-before\n"
    assert 0.5 <= r.duration <= 0.5 + 0.5 + SLACK
    assert "timed out" in r.describe()


def test_hangs_before_printing():
    r = run(["sleep", "1000"], 0.5, kill_grace=0.5)
    assert r.timed_out and r.returncode is None
    assert r.stdout == "" and r.stderr == ""
    assert r.duration <= 0.5 + 0.5 + SLACK


def test_grandchild_holding_pipes_is_killed_at_deadline(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    script = f"sleep 1000 & echo $! > {pidfile}; echo hi; wait"
    r = run(["sh", "-c", script], 1, kill_grace=1)
    assert r.timed_out
    assert r.stdout == "hi\n"
    assert r.duration <= 1 + 1 + SLACK  # not 1000 s
    grandchild = int(pidfile.read_text())
    assert not alive(grandchild)


def test_group_is_empty_after_timeout(tmp_path):
    pidfile = tmp_path / "pids"
    # Several generations, all in the child's group, all holding the pipes.
    script = (
        f"(sleep 1000 & echo $! >> {pidfile}; sleep 1000) & echo $! >> {pidfile}; "
        f"echo $$ >> {pidfile}; echo started; wait"
    )
    r = run(["sh", "-c", script], 1, kill_grace=1)
    assert r.timed_out and r.stdout == "started\n"
    pids = [int(p) for p in pidfile.read_text().split()]
    leader = pids[-1]
    assert live_in_group(leader) == set()
    assert not any(alive(p) for p in pids)


def test_background_job_after_normal_exit_does_not_hold_the_call(tmp_path):
    pidfile = tmp_path / "bg.pid"
    # The child exits at once with code 0; its background job keeps stdout open.
    r = run(["sh", "-c", f"sleep 1000 & echo $! > {pidfile}; echo done"], 30)
    assert r.returncode == 0
    assert not r.timed_out
    assert r.stdout == "done\n"
    assert r.duration < 30  # did not wait for the deadline, let alone the 1000 s
    assert r.duration >= DRAIN_AFTER_EXIT * 0.5  # the readers did get their bounded chance
    assert not alive(int(pidfile.read_text()))


def test_background_job_with_closed_pipes_is_not_left_behind(tmp_path):
    pidfile = tmp_path / "bg.pid"
    r = run(["sh", "-c", f"sleep 1000 >/dev/null 2>&1 & echo $! > {pidfile}"], 30)
    assert r.returncode == 0
    assert not alive(int(pidfile.read_text()))


def test_fifty_megabytes_is_capped_without_deadlock():
    cap = 1024 * 1024
    writer = (
        "import sys\n"
        "block = b'x' * (1024 * 1024)\n"
        "for _ in range(50):\n"
        "    sys.stdout.buffer.write(block)\n"
        "    sys.stderr.buffer.write(block)\n"
        "sys.stdout.flush(); sys.stderr.flush()\n"
    )
    r = run([PY, "-c", writer], 60, max_output=cap)
    assert r.returncode == 0  # the writer was never blocked into a timeout
    assert not r.timed_out
    assert len(r.stdout) == cap and len(r.stderr) == cap
    assert set(r.stdout) == {"x"}
    assert r.stdout_truncated and r.stderr_truncated


def test_fifty_megabytes_default_cap():
    r = run([PY, "-c", "import sys; sys.stdout.buffer.write(b'y' * 50_000_000)"], 60)
    assert r.returncode == 0
    assert len(r.stdout) == 4 * 1024 * 1024
    assert r.stdout_truncated and not r.stderr_truncated


def test_output_exactly_at_cap_is_not_truncated():
    r = run([PY, "-c", "import sys; sys.stdout.write('z' * 1000)"], 10, max_output=1000)
    assert len(r.stdout) == 1000 and not r.stdout_truncated
    r = run([PY, "-c", "import sys; sys.stdout.write('z' * 1001)"], 10, max_output=1000)
    assert len(r.stdout) == 1000 and r.stdout_truncated


def test_ignores_sigterm_dies_by_sigkill():
    script = (
        "import signal, sys, time\n"
        "def on_term(signum, frame):\n"
        "    print('got TERM, ignoring', flush=True)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    time.sleep(0.05)\n"
    )
    # 4 s: the child must have set its handler before the TERM comes, and 2 s of grace to say
    # so before the KILL, loaded machine or not
    r = run([PY, "-c", script], 4, kill_grace=2)
    assert r.timed_out and r.returncode is None
    # SIGTERM was delivered (and shrugged off) during the grace; SIGKILL ended it.
    assert r.stdout == "ready\ngot TERM, ignoring\n"
    assert r.duration >= 4 + 2
    assert r.duration <= 4 + 2 + SLACK


def test_sigterm_grace_ends_early_when_child_obeys():
    r = run(["sleep", "1000"], 0.5, kill_grace=60)
    assert r.timed_out
    assert r.duration < 60  # the grace is a maximum, not a fixed wait


def test_missing_binary_is_a_result():
    r = run(["gridgate-no-such-program-xyz", "--flag"], 5)
    assert r.launch_error is not None
    assert "No such file" in r.launch_error and "gridgate-no-such-program-xyz" in r.launch_error
    assert r.returncode is None and not r.timed_out and not r.ok
    assert r.describe().startswith("could not start")


def test_not_executable_is_a_result(tmp_path):
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    r = run([str(script)], 5)
    assert r.launch_error is not None and "Permission denied" in r.launch_error
    assert r.returncode is None


def test_missing_cwd_is_a_result(tmp_path):
    r = run(["true"], 5, cwd=tmp_path / "gone")
    assert r.launch_error is not None and r.returncode is None


def test_non_utf8_output_is_replaced():
    r = run(
        [
            PY,
            "-c",
            "import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe end'); "
            "sys.stderr.buffer.write(b'\\xc3')",
        ],
        5,
    )
    assert r.stdout == "ok \ufffd\ufffd end"
    assert r.stderr == "\ufffd"


@pytest.mark.parametrize("bad", ["echo hi", b"echo hi"])
def test_string_argv_is_refused(bad):
    with pytest.raises(TypeError, match="argv list"):
        run(bad, 5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        run([], 5)
    with pytest.raises(ValueError):
        run(["true"], 0)
    with pytest.raises(ValueError):
        run(["true"], float("nan"))
    with pytest.raises(TypeError):
        run(["echo", 3], 5)  # type: ignore[list-item]


def test_shell_metacharacters_are_plain_arguments(tmp_path):
    marker = tmp_path / "pwned"
    r = run(["echo", f"; touch {marker}", "$(id)", "`id`"], 5)
    assert r.stdout == f"; touch {marker} $(id) `id`\n"
    assert not marker.exists()


@pytest.mark.timeout(180)
def test_two_hundred_at_once_from_a_thread_pool(tmp_path):
    def one(i: int):
        if i % 3 == 0:
            # the mark is made after the echo: on a loaded host a shell may be killed before it
            # printed, but one that made its mark must have its line kept
            mark = tmp_path / f"printed{i}"
            return i, run(
                ["sh", "-c", f"echo hang{i}; : > {mark}; sleep 1000 & wait"], 1, kill_grace=0.5
            )
        if i % 3 == 1:
            return i, run(["sleep", "1000"], 1, kill_grace=0.5)
        return i, run(["sh", "-c", f"echo ok{i}"], 30)

    with ThreadPoolExecutor(max_workers=200) as pool:
        results = dict(pool.map(one, range(200)))

    assert sorted(results) == list(range(200))
    for i, r in results.items():
        assert r.launch_error is None, r.launch_error
        if i % 3 == 2:
            assert r.returncode == 0 and r.stdout == f"ok{i}\n"
        else:
            assert r.timed_out and r.returncode is None
            # killed, not the 1000 s it would sleep: 200 starts at once on a loaded 2-core
            # machine can take half a minute, so no tighter bound (the single-command tests
            # above hold the deadline itself)
            assert r.duration < 120
            if i % 3 == 0:
                printed = (tmp_path / f"printed{i}").exists()
                assert r.stdout == (f"hang{i}\n" if printed else ""), (i, printed, r.stdout)
    assert any((tmp_path / f"printed{i}").exists() for i in range(0, 200, 3))


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def test_keyboard_interrupt_kills_the_group(tmp_path):
    pidfile = tmp_path / "pids"
    pause = threading.Event()  # never set: its wait() is an interruptible pause for the thread

    def fire():
        # Wait until the command has started its grandchild, then interrupt the main thread.
        for _ in range(500):
            if pidfile.exists() and len(pidfile.read_text().split()) == 2:
                break
            pause.wait(0.01)
        os.kill(os.getpid(), signal.SIGUSR1)

    old = signal.signal(signal.SIGUSR1, _interrupt)
    t = threading.Thread(target=fire)
    try:
        t.start()
        with pytest.raises(KeyboardInterrupt):
            run(["sh", "-c", f"sleep 1000 & echo $! >> {pidfile}; echo $$ >> {pidfile}; wait"], 120)
    finally:
        t.join()
        signal.signal(signal.SIGUSR1, old)
    pids = [int(p) for p in pidfile.read_text().split()]
    assert not any(alive(p) for p in pids)
    assert live_in_group(pids[1]) == set()


@pytest.mark.timeout(120)
def test_keyboard_interrupt_at_any_moment_leaves_nothing():
    """Interrupts land at random points (inside Popen, before supervision, while polling):
    whatever was started is killed every time."""
    import random
    import uuid

    marker = f"gridgate-kbi-{uuid.uuid4().hex}"
    rng = random.Random(4)
    main = threading.get_ident()
    pause = threading.Event()
    old = signal.signal(signal.SIGUSR1, _interrupt)
    interrupted = 0
    try:
        for _ in range(40):
            delay = rng.choice([0.0, 0.0005, 0.002, 0.005, 0.02])

            def fire(delay=delay):
                pause.wait(delay)
                # At the main thread, where the runner is: a signal sent to the process may be
                # taken by any thread (often the sender), and the main thread then only runs
                # the handler when its blocking call returns, at the 60 s deadline.
                signal.pthread_kill(main, signal.SIGUSR1)

            t = threading.Thread(target=fire)
            try:
                t.start()
                # The inner sh carries the marker in its argv and has a child of its own.
                # A signal that lands just before the runner enters poll() is only handled
                # when poll returns (CPython checks for signals between bytecodes, and the
                # syscall is not interrupted): then the deadline kills the group and the
                # KeyboardInterrupt comes right after. A short deadline keeps that case quick.
                run(["sh", "-c", f"sh -c 'sleep 1000; :' {marker} & wait", marker], 5)
            except KeyboardInterrupt:
                interrupted += 1
            finally:
                t.join()
                try:
                    # A signal may still be pending: give Python the chance to run it here.
                    pause.wait(0.001)
                except KeyboardInterrupt:
                    interrupted += 1
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert interrupted == 40
    assert processes_with(marker) == []


def test_kill_process_group_helper():
    import subprocess

    proc = subprocess.Popen(
        [
            PY,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(1000)",
        ],
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout.readline() == b"ready\n"
        # The zombie keeps the group alive until reaped, so SIGKILL is always reported here.
        assert kill_process_group(proc.pid, 0.2) is True
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_child_closing_its_pipes_is_still_held_to_the_deadline():
    r = run(["sh", "-c", "echo bye; exec >&- 2>&-; exec sleep 1000"], 0.5, kill_grace=0.5)
    assert r.timed_out and r.returncode is None
    assert r.stdout == "bye\n"


def test_without_pidfd_the_exit_is_polled(monkeypatch, tmp_path):
    # Older kernels and other Unixes have no pidfd: the same behaviour through waitid polling.
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    r = run(["sh", "-c", "echo ok; exit 4"], 5)
    assert (r.returncode, r.stdout, r.timed_out) == (4, "ok\n", False)
    r = run(["sh", "-c", "echo hi; sleep 1000 & wait"], 0.5, kill_grace=0.5)
    assert r.timed_out and r.stdout == "hi\n"
    pidfile = tmp_path / "bg"
    r = run(["sh", "-c", f"sleep 1000 & echo $! > {pidfile}; echo done"], 30)
    assert (r.returncode, r.stdout, r.timed_out) == (0, "done\n", False)
    assert not alive(int(pidfile.read_text()))


def test_argv_chunks_splits_only_when_the_argv_would_grow_too_long() -> None:
    from gridgate.core.runner import argv_chunks

    ids = [str(1000 + i) for i in range(5000)]
    whole = argv_chunks(["bjobs", "-noheader"], ids)
    assert len(whole) == 1 and whole[0][2:] == ids
    small = argv_chunks(["bjobs"], ids, limit=1000)
    assert len(small) > 1 and [i for argv in small for i in argv[1:]] == ids
    assert all(sum(len(w) + 1 for w in argv) <= 1000 for argv in small)
    joined = argv_chunks(["squeue", "--jobs="], ids[:3], joiner=",")
    assert joined == [["squeue", "--jobs=1000,1001,1002"]]
    assert argv_chunks(["squeue"], []) == []
    assert argv_chunks(["x"], ["y" * 50], limit=10) == [["x", "y" * 50]]


# --- which clock a deadline is measured on (issue 24) -----------------------------------------


class _HangingBackend(Backend):
    """A backend whose submit command hangs: the deadline alone ends it."""

    name = "hang"
    endpoints_key = "servers"
    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "servers": {"type": "array", "items": {"type": "string"}, "default": ["s1"]},
            "program": {"type": "string"},
            "command_timeout": command_timeout_schema(),
        },
        "required": ["program"],
        "additionalProperties": False,
    }

    def submit(self, endpoint: Endpoint, request: SubmitRequest, timeout: float) -> SubmitResult:
        result = self.run([self.config["program"]], self.deadline(timeout))
        return SubmitResult(endpoint, ok=result.ok, command=result, job_ids=("1",) * result.ok)


def _in_thread(work: Callable[[], Any], bound: float = 120.0) -> Any:
    """``work()`` on a thread, failing the test (not hanging it) if it has not returned within
    ``bound`` seconds: a bound on a hang, not a measurement."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(work()), daemon=True)
    thread.start()
    thread.join(bound)
    assert not thread.is_alive(), f"still running after {bound} s: a deadline was never reached"
    return box[0]


def test_a_fake_clock_that_never_moves_still_kills_a_hanging_command_at_its_deadline(
    tmp_path,
) -> None:
    clock = FakeClock()  # never advanced: if deadlines read it, the command would run forever
    program = stand_in_command(tmp_path / "bin", "hang", stdout="started\n", sleep=600)
    backend = build_plugin(
        _HangingBackend, {"program": str(program), "command_timeout": 1}, clock=clock, name="hang"
    )
    doc = {"director": {"state_dir": str(tmp_path / "state")}, "demand": {"static": {"hang": 1}}}
    with contextlib.closing(director_for(doc, backend, clock=clock)) as director:
        summary = _in_thread(director.run_iteration)
    assert [f.kind for f in summary.failures] == ["timeout"]
    [call] = program.calls()
    assert not alive(call["pid"]), "the hanging command outlived its deadline"
    assert clock.time() == FakeClock().time()  # nothing moved the fake clock


def test_a_fake_clock_that_jumps_does_not_cut_a_command_short(tmp_path) -> None:
    clock = FakeClock()
    program = stand_in_command(tmp_path / "bin", "slow", stdout="Submitted\n", sleep=1)
    backend = build_plugin(_HangingBackend, {"program": str(program)}, clock=clock, name="hang")
    stop = threading.Event()

    def jump() -> None:  # a day of fake time per step while the command runs
        while not stop.is_set():
            clock.advance(86400)
            stop.wait(0.01)

    jumper = threading.Thread(target=jump, daemon=True)
    jumper.start()
    try:
        result = backend.gridgate_submit(
            endpoint=Endpoint("hang", "s1"), request=SubmitRequest("hang"), timeout=60
        )
    finally:
        stop.set()
        jumper.join()
    assert clock.time() > FakeClock().time() + 86400  # the clock did jump meanwhile
    assert result.ok and result.command.stdout == "Submitted\n" and not result.command.timed_out
