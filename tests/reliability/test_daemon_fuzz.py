"""Protocol fuzzing of the token daemon: generated bad lines over real Unix and TCP sockets."""

from __future__ import annotations

import json
import os
import socket
from collections import Counter
from typing import Any

import pytest
from daemonkit import free_port, lsf_fixtures, read_replies, status, until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gridgate.core.clock import FakeClock
from gridgate.plugins.lsf_proxy.protocol import ADMIN_OPS, PUBLIC_OPS, encode, sign

sockdir = lsf_fixtures.sockdir
start_daemon = lsf_fixtures.start_daemon

pytestmark = pytest.mark.timeout(600)

# CI sends this many lines per transport (20,000 in all); the figures in docs/reliability.md
# were measured once with GRIDGATE_RELIABILITY_FUZZ_MESSAGES=50000 (100,000 in all).
MESSAGES = int(os.environ.get("GRIDGATE_RELIABILITY_FUZZ_MESSAGES", "10000"))
DRAWS = 8  # about this many drawn requests per connection, each sent len(MANGLES) ways
PER_CONNECTION = DRAWS * 8
MAX_LINE = 2048
KEY = "fuzz-key-0123456789"
BIG = 10**6
SECTION = {
    "policies": f"QUERY[max={BIG} nominal={BIG}] SUBMISSION[max={BIG} nominal={BIG}] "
    f"OTHER[max={BIG} nominal={BIG}]",
    "max_line_bytes": MAX_LINE,
    "sample_period": 86400,
}

# strings JSON can carry but UTF-8 cannot: lone surrogates (issue 21: an id of "\ud800" could
# not be echoed, and each such request cost a traceback), beside ordinary text
LONE = ["\ud800", "\udfff", "\udbff\udbff", "\udc00x", "é", "a", ";$(id)", "'\"`"]
texts = st.text(max_size=12) | st.lists(st.sampled_from(LONE), min_size=1, max_size=4).map("".join)
scalars = (
    st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | st.floats() | texts
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=5,
)
ops = st.sampled_from(
    sorted(PUBLIC_OPS | ADMIN_OPS) + ["", "ACQUIRE", "shutdown", "hello ", "hello\ud800"]
)
fields = {
    "category": st.sampled_from(["query", "sub", "submission", "other", "all", "QUERY", ""])
    | json_values,
    "opcode": st.sampled_from(["bjobs", "bsub", "BATCH_JOB_QUERY", "x" * 129]) | json_values,
    "size": st.integers(-5, 2**64) | json_values,
    "token": texts | json_values,
    "users": st.lists(texts, max_size=3) | json_values,
    "hosts": st.lists(texts, max_size=3) | json_values,
    "all": json_values,
    "on": json_values,
    "file": texts | json_values,
    "minutes": json_values,
    "service": json_values,
    "leaving": json_values,
}
# one_of picks its branches about evenly: mostly the right version and a known op, so most
# lines get past the framing to the field and signature checks
requests = st.fixed_dictionaries(
    {
        "v": st.one_of(
            st.just(1), st.just(1), st.just(1), st.sampled_from([2, 0, "1", None, 1.5]), json_values
        ),
        "id": st.integers(0, 2**31) | json_values,
        "op": st.one_of(ops, ops, ops, json_values),
    },
    optional=fields,
)
# what happens to a request on its way to the wire: every drawn request is sent each way
MANGLES = ("none", "truncate", "oversize", "bad_utf8", "not_object", "garbage", "blank", "crlf")
# TCP only: how it is signed
auths = st.sampled_from(
    ["valid"] * 4
    + [
        "none",
        "wrong_key",
        "bad_mac",
        "stale",
        "future",
        "tampered",
        "replay",
        "auth_junk",
        "short_nonce",
        "unbound",
        "other_challenge",
        "other_daemon",
        "replay_elsewhere",
    ]
)
#: a validly signed line of an earlier connection: replayed on another one, it must fail
EARLIER: list[bytes] = []
draws = st.tuples(requests, auths, st.integers(0, 10**6), st.binary(max_size=120), json_values)
batches = st.tuples(
    st.lists(draws, min_size=DRAWS // 2, max_size=2 * DRAWS), st.binary(max_size=60)
)  # an unterminated tail sent before closing


def _wire(
    request: dict[str, Any],
    auth: str,
    pick: int,
    junk: bytes,
    other: Any,
    tcp: bool,
    last_signed: list[bytes],
    bound: tuple[str, str] | None = None,
) -> list[bytes]:
    """The lines (without newlines) the fuzzer sends for one drawn request; ``bound``: the
    connection's challenge and the daemon's name (TCP)."""
    # signed once: the plain and the CRLF copies of a valid request are a request and its replay
    raw = _signed(request, auth, other, tcp, last_signed, bound)
    return [_mangle(raw, mangle, pick, junk, request, other) for mangle in MANGLES]


def _signed(
    request: dict[str, Any],
    auth: str,
    other: Any,
    tcp: bool,
    last_signed: list[bytes],
    bound: tuple[str, str] | None = None,
) -> bytes:
    if tcp:
        if auth == "replay" and last_signed:
            return last_signed[-1]
        if auth == "replay_elsewhere" and EARLIER:
            return EARLIER[-1]
        if auth == "auth_junk":
            request = {**request, "auth": other}
        elif auth != "none":
            clock = {"stale": FakeClock(1e9), "future": FakeClock(4e9)}.get(auth)
            key = "guess" if auth == "wrong_key" else KEY
            challenge, name = bound or (None, None)
            if auth == "unbound":
                challenge = name = None
            elif auth == "other_challenge":
                challenge = "0" * 32
            elif auth == "other_daemon":
                name = "another-daemon"
            request = sign(
                dict(request),
                key,
                "fuzzer",
                "fuzzhost",
                challenge=challenge,
                daemon=name,
                **({"clock": clock} if clock else {}),
            )
            if auth == "bad_mac":
                request["auth"]["mac"] = request["auth"]["mac"][::-1]
            elif auth == "tampered":
                request["auth"]["user"] = "root"
            elif auth == "short_nonce":
                request["auth"]["nonce"] = "abc"
    try:
        raw = encode(request)[:-1]
    except (ValueError, TypeError):
        raw = json.dumps(request, default=str).encode()
    if tcp and auth == "valid":
        last_signed.append(raw)
    return raw


def _mangle(
    raw: bytes, mangle: str, pick: int, junk: bytes, request: dict[str, Any], other: Any
) -> bytes:
    if mangle == "truncate":
        raw = raw[: pick % max(1, len(raw))]
    elif mangle == "oversize":
        raw = raw + b" " * (MAX_LINE + 1 + pick % 5000)
    elif mangle == "bad_utf8":
        at = pick % (len(raw) + 1)
        raw = raw[:at] + (b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80")[pick % 4] + raw[at:]
    elif mangle == "not_object":
        raw = json.dumps([request.get("op"), other], default=str).encode()
    elif mangle == "garbage":
        raw = junk
    elif mangle == "blank":
        raw = b" \t\r" * (pick % 3)
    elif mangle == "crlf":
        raw = raw + b"\r"
    return raw.replace(b"\n", b" ")


def _expected_reply(line: bytes) -> bool:
    # the daemon answers every non-blank line; an oversized one once, whatever it holds
    return len(line) > MAX_LINE or bool(line.strip())


class Tally:
    def __init__(self) -> None:
        self.lines = 0
        self.connections = 0
        self.codes: Counter[str] = Counter()
        self.results: Counter[str] = Counter()


def _fuzz(connect, tcp: bool, tally: Tally) -> None:
    # hypothesis decides how many lines each example holds: run until enough were sent
    while tally.lines < MESSAGES:
        examples = max(1, (MESSAGES - tally.lines) // (PER_CONNECTION * 3 // 4))
        _fuzz_run(connect, tcp, tally, examples)


def _fuzz_run(connect, tcp: bool, tally: Tally, examples: int) -> None:
    @settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(batch=batches)
    def run(batch: tuple[list[tuple], bytes]) -> None:
        items, tail = batch
        signed: list[bytes] = []
        with connect() as sock:
            bound = None
            if tcp:  # the challenge every signature on this connection must cover
                sock.sendall(b'{"v":1,"id":"hi","op":"hello"}\n')
                (hi,) = read_replies(sock, 1)
                bound = (hi["challenge"], hi["name"])
            wire = [
                line
                for item in items
                for line in _wire(*item, tcp=tcp, last_signed=signed, bound=bound)
            ]
            expected = sum(_expected_reply(line) for line in wire)
            sock.sendall(b"".join(line + b"\n" for line in wire))
            replies = read_replies(sock, expected)
            # every non-blank line answered once: nothing missing, and the next reply is the
            # marker's (nothing extra)
            assert len(replies) == expected, (len(replies), expected, wire[:3])
            marker: dict[str, Any] = {"v": 1, "id": "end-of-batch", "op": "hello"}
            if tcp:
                assert bound is not None
                marker = sign(
                    marker, KEY, "fuzzer", "fuzzhost", challenge=bound[0], daemon=bound[1]
                )
                EARLIER[:] = [encode(marker)[:-1]]
            sock.sendall(encode(marker))
            (last,) = read_replies(sock, 1)
            assert last.get("id") == "end-of-batch" and last.get("ok") is True, last
            sock.sendall(tail.replace(b"\n", b""))
        tally.lines += len(wire) + (1 if tail else 0)
        tally.connections += 1
        for reply in replies:
            assert reply.get("v") == 1 and isinstance(reply.get("ok"), bool), reply
            if reply["ok"]:
                if "result" in reply:
                    tally.results[f"{reply['result']}:{reply.get('reason', '')}"] += 1
            else:
                # an internal error is an exception the daemon did not expect: a bug
                assert reply["error"]["code"] != "internal", reply
                tally.codes[reply["error"]["code"]] += 1

    run()


def _check_consistent(path: str, tally: Tally, pid: int) -> dict[str, Any]:
    """After every fuzz connection closed: nothing held, nothing queued, counters match."""
    assert until(lambda: status(path)["connections"] == 1, 20), status(path)["connections"]
    after = status(path)
    assert after["pid"] == pid
    for name, cat in after["categories"].items():
        assert (cat["in_use"], cat["in_use_privileged"], cat["queued"]) == (0, 0, 0), name
    metrics = after["metrics"]
    granted = sum(n for key, n in tally.results.items() if key.startswith("granted"))
    assert sum(metrics[f"requests.{c}"]["current"] for c in after["categories"]) == granted
    errors = sum(n for code, n in tally.codes.items() if code != "forbidden")
    assert metrics["error"]["current"] == errors, (metrics["error"], tally.codes)
    # still serving: a fresh pair works (the Unix fuzzer is root: it may have disabled it)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(20)
        sock.connect(path)
        sock.sendall(
            b'{"v":1,"id":1,"op":"enable","category":"all"}\n'
            b'{"v":1,"id":1,"op":"acquire","category":"query"}\n'
        )
        _, got = read_replies(sock, 2)
        assert got["result"] == "granted"
        sock.sendall(
            b'{"v":1,"id":2,"op":"release","token":%s}\n' % json.dumps(got["token"]).encode()
        )
        assert read_replies(sock, 1)[0]["released"] is True
    return after


def test_fuzz_unix_socket(start_daemon, sockdir, figures):
    d = start_daemon(dict(SECTION))
    tally = Tally()

    def connect() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(30)
        sock.connect(d.socket)
        return sock

    _fuzz(connect, False, tally)
    _check_consistent(d.socket, tally, d.pid)
    assert d.proc.poll() is None and "Traceback" not in d.log()
    figures(
        lines=tally.lines,
        connections=tally.connections,
        errors=dict(tally.codes),
        results=dict(tally.results),
    )


def test_fuzz_tcp_signed(start_daemon, sockdir, figures):
    key = sockdir / "key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    port = free_port()
    d = start_daemon({**SECTION, "tcp": f"127.0.0.1:{port}", "key": {"file": str(key)}})
    tally = Tally()

    def connect() -> socket.socket:
        return socket.create_connection(("127.0.0.1", port), timeout=30)

    _fuzz(connect, True, tally)
    # the signature checks were exercised, and none let a bad request through
    for code in (
        "unsigned",
        "bad_signature",
        "bad_challenge",
        "stale",
        "replayed",
        "bad_json",
        "line_too_long",
    ):
        assert tally.codes[code] > 0, (code, tally.codes)
    _check_consistent(d.socket, tally, d.pid)
    assert d.proc.poll() is None and "Traceback" not in d.log()
    figures(
        lines=tally.lines,
        connections=tally.connections,
        errors=dict(tally.codes),
        results=dict(tally.results),
    )
