"""The built-in ``bearer_token`` credential plugin (core/builtin/bearer_token.py): the token's end
from its ``exp`` claim, renewal by a real command, WLCG Bearer Token Discovery, private files
only, and the director pausing the backends that need kind ``token`` while it is unusable."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from loguru import logger
from support.tokens import b64url, jwt
from support.uids import AS_NOBODY

from gridgate.core import hookimpl
from gridgate.core.builtin.bearer_token import COPY_NAME, BearerToken, discover
from gridgate.core.clock import FakeClock
from gridgate.core.model import (
    BackendInfo,
    CredentialStatus,
    Endpoint,
    JobStatus,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import PluginContext
from gridgate.core.runner import run
from gridgate.core.testing import Collector, build_plugin, director_for, make_config, section_for

START = 1_700_000_000.0  # FakeClock's default start
HOUR = 3600.0
NOBODY = 65534

#: The renewal command of the tests: writes a fresh token to --out whose exp is the time in
#: --clock (the test's FakeClock, written there) plus --lifetime; fails while --fail-if exists.
RENEW_TOOL = '''"""Write a fresh JWT to --out (a stand-in for htgettoken / oidc-token)."""
import argparse, base64, json, os, sys

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--clock", required=True)
parser.add_argument("--lifetime", type=float, default=3600)
parser.add_argument("--fail-if")
parser.add_argument("--log")
args = parser.parse_args()
if args.log:
    with open(args.log, "a") as log:
        log.write("renew\\n")
if args.fail_if and os.path.exists(args.fail_if):
    print("htgettoken: the vault refused: token issuer unreachable", file=sys.stderr)
    sys.exit(1)
now = float(open(args.clock).read())
def part(obj):
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
token = ".".join([part({"alg": "RS256", "typ": "JWT"}),
                  part({"iss": "https://issuer.example", "sub": "pilots", "iat": int(now),
                        "nbf": int(now), "exp": int(now + args.lifetime)}), "c2lnbmF0dXJl"])
fd = os.open(args.out + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as out:
    out.write(token + "\\n")
os.replace(args.out + ".new", args.out)
'''


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class Site:
    """A folder with a token file, the renewal tool, its clock file and its log."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.clock = FakeClock(START)
        self.token = folder / "token"
        self.tool = folder / "renew_tool.py"
        self.tool.write_text(RENEW_TOOL, encoding="utf-8")
        self.clock_file = folder / "clock"
        self.fail_file = folder / "renewal-fails"
        self.log = folder / "renewals.log"
        self.tick()

    def tick(self, seconds: float = 0.0) -> None:
        self.clock.advance(seconds)
        self.clock_file.write_text(str(self.clock.time()), encoding="utf-8")

    def write(self, text: str, mode: int = 0o600, path: Path | None = None) -> Path:
        target = path or self.token
        target.write_text(text + "\n", encoding="utf-8")
        target.chmod(mode)
        return target

    def issue(self, left: float, path: Path | None = None) -> float:
        """A token that ends ``left`` seconds from the clock's now; its exp."""
        end = self.clock.time() + left
        self.write(jwt(exp=int(end), nbf=int(self.clock.time() - 60)), path=path)
        return float(int(end))

    def renew(self, lifetime: float = 3 * HOUR) -> list[str]:
        return [
            sys.executable,
            str(self.tool),
            "--out",
            str(self.token),
            "--clock",
            str(self.clock_file),
            "--lifetime",
            str(lifetime),
            "--fail-if",
            str(self.fail_file),
            "--log",
            str(self.log),
        ]

    def renewals(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0

    def plugin(self, **section: Any) -> BearerToken:
        section.setdefault("path", str(self.token))
        return build_plugin(BearerToken, section, clock=self.clock, state_dir=self.folder / "state")


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """None of the discovery variables of the machine's environment."""
    for name in ("BEARER_TOKEN", "BEARER_TOKEN_FILE", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


def check(plugin: BearerToken, timeout: float = 60) -> CredentialStatus:
    return plugin.check(timeout)


# --- the token's end ---------------------------------------------------------------------------


def test_gridgate_check_credentials_reports_a_valid_token_with_its_end_from_exp(site: Site) -> None:
    end = site.issue(left=2 * HOUR)
    status = check(site.plugin(renew=site.renew()))
    assert status.usable and status.kind == "token" and status.name == "bearer_token"
    assert status.expires == end and status.path == str(site.token)
    assert status.message == f"bearer token {site.token} valid until {_iso(end)} (2.0 hours left)"
    assert status.command is None and site.renewals() == 0  # more than min_lifetime (600 s) left


def test_a_token_with_less_than_min_lifetime_left_is_renewed_and_read_again(site: Site) -> None:
    site.issue(left=300)
    status = check(site.plugin(renew=site.renew(lifetime=3 * HOUR)))
    assert status.usable and status.renewed and site.renewals() == 1
    assert status.command is not None and status.command.ok
    assert status.expires == START + 3 * HOUR
    assert "renewed: valid until" in status.message
    assert stat.S_IMODE(site.token.stat().st_mode) == 0o600


def test_an_expired_token_whose_renewal_fails_is_unusable_with_the_renewals_words(
    site: Site,
) -> None:
    end = site.issue(left=-120)
    site.fail_file.touch()
    status = check(site.plugin(renew=site.renew()))
    assert not status.usable and status.expires == end
    assert status.message == (
        f"bearer token {site.token} expired at {_iso(end)} (2 minutes ago); "
        "the renewal failed (exit code 1)"
    ), status.message
    assert status.command is not None and status.command.returncode == 1
    assert "the vault refused" in status.command.stderr


def test_a_token_not_yet_valid_is_unusable(site: Site) -> None:
    site.write(jwt(nbf=int(START + HOUR), exp=int(START + 2 * HOUR)))
    status = check(site.plugin())
    assert not status.usable and "is not valid before" in status.message


def test_a_token_from_an_issuer_whose_clock_runs_a_little_ahead_is_usable(site: Site) -> None:
    """A token fetched a moment ago from an issuer whose clock is 30 s ahead begins 30 s from
    now by ours: usable (a minute's leeway, as JWT libraries allow); 2 minutes ahead is not.
    Before: unusable for an iteration, and the token's groups paused and told."""
    site.write(jwt(nbf=int(START + 30), exp=int(START + 2 * HOUR)))
    assert check(site.plugin()).usable
    site.write(jwt(nbf=int(START + 120), exp=int(START + 2 * HOUR)))
    status = check(site.plugin())
    assert not status.usable and "is not valid before" in status.message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("not a token at all", "holds no JWT (a token is three base64url parts"),
        ("aaa.bbb", "this has 2 parts"),
        ("e30.!!!!.sig", "header or payload is not base64url-encoded JSON"),
        (f"{b64url(b'[1]')}.{b64url(b'[2]')}.sig", "is not a JSON object"),
        (jwt(), "holds a JWT without an exp claim: its end is unknown"),
        (jwt(exp="tomorrow"), "whose exp claim is not a number: 'tomorrow'"),
        (jwt(exp=True), "whose exp claim is not a number: True"),
        (jwt(exp=int(START + HOUR), nbf="soon"), "whose nbf claim is not a number"),
        # a 400-digit exp is a number no date has: a bad token, not an OverflowError
        (jwt(exp=10**400), "whose exp claim is not a date (out of range): 1000000000"),
        (jwt(exp=int(START + HOUR), nbf=-(10**30)), "whose nbf claim is not a date"),
        (
            b64url({"alg": "none"}) + "." + b64url(b'{"exp": 1e400}') + ".sig",
            "holds a JWT with a number out of range",
        ),
    ],
)
def test_a_file_that_holds_no_usable_jwt_is_unusable_with_a_clear_message(
    site: Site, text: str, words: str
) -> None:
    site.write(text)
    status = check(site.plugin())
    assert not status.usable and status.message.startswith(f"bearer token {site.token} ")
    assert words in status.message, status.message
    assert status.expires is None


def test_a_missing_token_is_unusable_and_renew_makes_it(site: Site) -> None:
    plugin = site.plugin(renew=site.renew())
    assert not check(site.plugin()).usable
    status = check(plugin)
    assert status.usable and status.renewed and site.token.exists()


# --- only private files ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660])
def test_a_token_file_others_may_read_or_write_is_refused_saying_its_mode_and_the_one_it_needs(
    site: Site, mode: int
) -> None:
    site.issue(left=2 * HOUR)
    site.token.chmod(mode)
    status = check(site.plugin())
    assert not status.usable
    assert f"has mode {mode:04o}: its group or others may read or write it" in status.message
    assert "mode 0600 or 0400 (chmod 600 it)" in status.message


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_token_file_is_used(site: Site, mode: int) -> None:
    site.issue(left=2 * HOUR)
    site.token.chmod(mode)
    assert check(site.plugin()).usable


def _nobody_folder() -> Path:
    """A folder nobody may write into (the tests' own tmp_path is root's, 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="gg-bearer-", dir="/tmp"))
    folder.chmod(0o1777)
    return folder


def _as_nobody(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AS_NOBODY, *argv], capture_output=True, text=True, timeout=60, cwd="/", **kwargs
    )


def test_a_token_file_of_another_user_is_refused_saying_whose_it_is_and_whose_it_must_be(
    site: Site,
) -> None:
    folder = _nobody_folder()
    try:
        token = folder / "token"
        # written by the real uid nobody: the owner that could replace the token
        made = _as_nobody(
            [
                sys.executable,
                "-c",
                "import os, sys; os.umask(0o077); open(sys.argv[1], 'w').write(sys.argv[2])",
                str(token),
                jwt(exp=int(START + 2 * HOUR)),
            ]
        )
        assert made.returncode == 0, made.stderr
        assert token.stat().st_uid == NOBODY and stat.S_IMODE(token.stat().st_mode) == 0o600
        status = check(site.plugin(path=str(token)))
        assert not status.usable
        me = os.geteuid()
        assert f"is owned by uid {NOBODY} (nobody), not by uid {me} " in status.message
        assert f"its owner could replace it; it must belong to uid {me}" in status.message
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_as_an_ordinary_user_its_own_token_is_used_and_roots_is_refused() -> None:
    folder = _nobody_folder()
    try:
        roots = folder / "roots"
        roots.write_text(jwt(exp=int(START + 2 * HOUR)) + "\n")
        roots.chmod(0o600)
        code = (
            "import os, sys\n"
            "from gridgate.core.builtin.bearer_token import BearerToken\n"
            "from gridgate.core.clock import FakeClock\n"
            "from gridgate.core.testing import build_plugin\n"
            "own = sys.argv[1] + '/own'\n"
            "fd = os.open(own, os.O_WRONLY | os.O_CREAT, 0o600)\n"
            "os.write(fd, sys.argv[2].encode()); os.close(fd)\n"
            "for path in (own, sys.argv[1] + '/roots'):\n"
            "    status = build_plugin(BearerToken, {'path': path}, clock=FakeClock()).check(30)\n"
            "    print(status.usable, status.message)\n"
        )
        out = _as_nobody([sys.executable, "-c", code, str(folder), jwt(exp=int(START + HOUR))])
        assert out.returncode == 0, out.stderr
        mine, theirs = out.stdout.splitlines()
        assert mine.startswith("True bearer token ") and "valid until" in mine
        assert (
            theirs.startswith("False ") and "is owned by uid 0 (root), not by uid 65534" in theirs
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- WLCG Bearer Token Discovery -----------------------------------------------------------------

#: An effective uid of nobody's machine: discovery's /tmp/bt_u$UID never meets a real user's.
FAKE_UID = 4_242_424


def test_discovery_takes_bearer_token_first_then_the_first_file_that_exists(
    tmp_path: Path,
) -> None:
    env_file = tmp_path / "env-token"
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    tmp_file = Path(f"/tmp/bt_u{FAKE_UID}")
    everything = {
        "BEARER_TOKEN": "eyJ.a.b",
        "BEARER_TOKEN_FILE": str(env_file),
        "XDG_RUNTIME_DIR": str(xdg),
    }
    assert discover(everything, FAKE_UID) == (None, "BEARER_TOKEN")
    assert discover({**everything, "BEARER_TOKEN": "  \n"}, FAKE_UID)[1] != "BEARER_TOKEN"
    # none exists: the first that applies, where a renewal is expected to write
    files = {k: v for k, v in everything.items() if k != "BEARER_TOKEN"}
    assert discover(files, FAKE_UID) == (env_file, "BEARER_TOKEN_FILE")
    assert discover({"XDG_RUNTIME_DIR": str(xdg)}, FAKE_UID) == (
        xdg / f"bt_u{FAKE_UID}",
        f"$XDG_RUNTIME_DIR/bt_u{FAKE_UID}",
    )
    assert discover({}, FAKE_UID) == (tmp_file, f"/tmp/bt_u{FAKE_UID}")
    # the first that exists
    (xdg / f"bt_u{FAKE_UID}").write_text("t")
    assert discover(files, FAKE_UID) == (
        xdg / f"bt_u{FAKE_UID}",
        f"$XDG_RUNTIME_DIR/bt_u{FAKE_UID}",
    )
    env_file.write_text("t")
    assert discover(files, FAKE_UID) == (env_file, "BEARER_TOKEN_FILE")
    try:
        tmp_file.write_text("t")
        assert discover({"XDG_RUNTIME_DIR": str(tmp_path / "empty")}, FAKE_UID) == (
            tmp_file,
            f"/tmp/bt_u{FAKE_UID}",
        )
    finally:
        tmp_file.unlink(missing_ok=True)


def test_without_path_the_plugin_uses_bearer_token_file_and_says_where_it_looked(
    site: Site, bare_env: pytest.MonkeyPatch
) -> None:
    found = site.folder / "from-env"
    bare_env.setenv("BEARER_TOKEN_FILE", str(found))
    plugin = build_plugin(BearerToken, {}, clock=site.clock, state_dir=site.folder / "state")
    assert plugin.gridgate_credential_env(kind="token") == {"BEARER_TOKEN_FILE": str(found)}
    status = check(plugin)
    assert not status.usable
    assert status.message == (
        f"bearer token {found} does not exist (found by WLCG token discovery: "
        "BEARER_TOKEN_FILE); no renew command is configured"
    )
    site.issue(left=HOUR, path=found)
    assert check(plugin).usable


def test_without_path_the_plugin_takes_xdg_runtime_dir(
    site: Site, bare_env: pytest.MonkeyPatch
) -> None:
    xdg = site.folder / "run-user"
    xdg.mkdir(mode=0o700)
    bare_env.setenv("XDG_RUNTIME_DIR", str(xdg))
    token = xdg / f"bt_u{os.geteuid()}"
    site.issue(left=HOUR, path=token)
    status = check(build_plugin(BearerToken, {}, clock=site.clock))
    assert status.usable and status.path == str(token)


@pytest.mark.parametrize(
    "mode",
    [
        # sticky like /tmp: where fs.protected_symlinks is 0 (many containers) the kernel
        # follows another user's link there; the reader must refuse it either way
        pytest.param(0o1777, id="sticky-like-tmp"),
        pytest.param(0o777, id="world-writable-not-sticky"),
    ],
)
def test_a_token_discovered_through_another_users_link_in_a_shared_folder_is_refused(
    site: Site, bare_env: pytest.MonkeyPatch, mode: int
) -> None:
    # issue 40 item 6, round 5: another local user links bt_u<uid> in a folder anyone may
    # write to a private file of the director's user; every check passed on the link's
    # target, and that file went to the services as the user's token
    folder = _nobody_folder()
    try:
        folder.chmod(mode)
        secret = site.folder / "private-file"
        site.issue(left=HOUR, path=secret)  # passes every check on the link's target
        link = folder / f"bt_u{os.geteuid()}"
        made = _as_nobody(["ln", "-s", str(secret), str(link)])
        assert made.returncode == 0, made.stderr
        assert link.is_symlink() and link.lstat().st_uid == NOBODY
        bare_env.setenv("XDG_RUNTIME_DIR", str(folder))
        plugin = build_plugin(BearerToken, {}, clock=site.clock, state_dir=site.folder / "state")
        status = check(plugin)
        assert not status.usable and status.path == str(link), status
        assert "symbolic link" in status.message, status.message
        # the user's own regular token file in the same folder is taken
        link.unlink()
        site.issue(left=HOUR, path=link)
        assert check(plugin).usable
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_token_in_bearer_token_is_handed_out_as_a_private_copy_and_never_renewed(
    site: Site, bare_env: pytest.MonkeyPatch
) -> None:
    value = jwt(exp=int(START + HOUR))
    bare_env.setenv("BEARER_TOKEN", f"  {value}\n")
    bare_env.setenv("BEARER_TOKEN_FILE", str(site.token))  # BEARER_TOKEN comes first
    state = site.folder / "state"
    plugin = build_plugin(BearerToken, {"renew": site.renew()}, clock=site.clock, state_dir=state)
    copy = state / COPY_NAME
    # a backend asking before any check (gridgate pilots cancel) gets the file, already there
    assert plugin.gridgate_credential_env(kind="token") == {"BEARER_TOKEN_FILE": str(copy)}
    assert copy.read_text() == value + "\n"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    assert stat.S_IMODE(copy.parent.stat().st_mode) == 0o700
    site.tick(HOUR - 60)  # short: less than min_lifetime left
    status = check(plugin)
    assert status.usable and status.path == str(copy) and status.command is None
    assert site.renewals() == 0  # no command can change the variable: renew is not run
    assert "the token of the BEARER_TOKEN variable, which no command can renew" in status.message
    # the copy is the variable's, whatever was done to the file meanwhile
    copy.write_text("tampered\n")
    copy.chmod(0o644)
    assert check(plugin).usable and copy.read_text() == value + "\n"
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600


def test_a_named_token_of_the_variable_is_copied_to_its_own_file_under_its_name(
    site: Site, bare_env: pytest.MonkeyPatch
) -> None:
    """Two named tokens never share a file: ``atlas-token``'s copy is credentials/atlas-token."""
    value = jwt(exp=int(START + HOUR))
    bare_env.setenv("BEARER_TOKEN", value)
    state = site.folder / "state"
    context = PluginContext(clock=site.clock, state_dir=state)
    plugin = BearerToken(section_for(BearerToken, {}), context, name="atlas-token")
    own = state / "credentials" / "atlas-token"
    assert plugin.name == "atlas-token"
    assert plugin.gridgate_credential_env(kind="token") == {"BEARER_TOKEN_FILE": str(own)}
    assert own.read_text() == value + "\n" and not (state / COPY_NAME).exists()
    status = check(plugin)
    assert status.usable and status.name == "atlas-token" and status.path == str(own)


# --- hooks and config ------------------------------------------------------------------------------


def test_gridgate_credential_env_answers_kind_token_only_from_the_config(site: Site) -> None:
    plugin = site.plugin()
    assert not site.token.exists()  # no check, no file: answered from the section
    assert plugin.gridgate_credential_env(kind="token") == {"BEARER_TOKEN_FILE": str(site.token)}
    assert plugin.gridgate_credential_env(kind="x509") is None


def test_the_section_needs_no_path_and_gets_its_defaults(bare_env: pytest.MonkeyPatch) -> None:
    config = make_config({"state": {"driver": "memory"}, "credentials": {"bearer_token": {}}})
    assert config.data["credentials"]["bearer_token"] == {
        "min_lifetime": 600,
        "renew": [],
        "timeout": None,
    }
    with pytest.raises(Exception, match="path"):
        make_config({"state": {"driver": "memory"}, "credentials": {"bearer_token": {"path": ""}}})


# --- the director ---------------------------------------------------------------------------------


class TokenBackend:
    """A backend whose commands need a bearer token (``credentials=("token",)``) or nothing: it
    submits by running a real program with ``context.credential_env`` of its kinds and records
    the BEARER_TOKEN_FILE the program saw."""

    def __init__(self, name: str, credentials: Sequence[str]) -> None:
        self.name, self.credentials = name, tuple(credentials)
        self.endpoints = (Endpoint(name, f"{name}-ce1"), Endpoint(name, f"{name}-ce2"))
        self.context: Any = None
        self.seen: list[str] = []
        self.polled: list[str] = []
        self.lock = threading.Lock()

    @hookimpl
    def gridgate_backend_info(self, backend: str) -> BackendInfo | None:
        if backend != self.name:
            return None
        return BackendInfo(self.name, self.endpoints, credentials=self.credentials)

    @hookimpl
    def gridgate_submit(
        self, endpoint: Endpoint, request: SubmitRequest, timeout: float
    ) -> SubmitResult | None:
        if endpoint.backend != self.name:
            return None
        env = {"PATH": "/usr/bin:/bin"}
        for kind in self.credentials:
            env.update(self.context.credential_env(kind))
        job = uuid.uuid4().hex[:8]
        code = f"import os; print(os.environ.get('BEARER_TOKEN_FILE', '-')); print('{job}')"
        result = run([sys.executable, "-c", code], timeout=timeout, env=env)
        with self.lock:
            self.seen.append(result.stdout.splitlines()[0] if result.ok else "?")
        return SubmitResult(endpoint, ok=result.ok, job_ids=(job,), command=result)

    @hookimpl
    def gridgate_job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        if endpoint.backend != self.name:
            return None
        with self.lock:
            self.polled.append(endpoint.name)
        return StatusResult(
            endpoint, ok=True, statuses={j: JobStatus(j, "waiting") for j in job_ids}
        )


def test_an_expired_token_pauses_only_the_backends_that_need_it_and_blames_no_server(
    site: Site,
) -> None:
    needs = TokenBackend("arcrest", ("token",))
    plain = TokenBackend("plain", ())
    collector = Collector()
    doc = {
        "director": {"cycle_seconds": 60, "command_timeout": 20, "max_threads": 2},
        "demand": {"static": {"arcrest": 2, "plain": 2}},
        "credentials": {"bearer_token": {"path": str(site.token), "renew": site.renew()}},
    }
    director = director_for(doc, needs, plain, collector, clock=site.clock)
    needs.context = plain.context = director.context
    try:
        site.issue(left=2 * HOUR)
        first = director.run_iteration()
        assert needs.seen == [str(site.token)] * 2 and len(plain.seen) == 2

        site.tick(3 * HOUR)  # the token has expired, and its renewal fails
        site.fail_file.touch()
        polls = len(needs.polled)
        paused = director.run_iteration()
        by_backend = {(r.backend, r.outcome, r.failure_kind) for r in paused.records}
        assert ("arcrest", "skipped", "credential") in by_backend
        assert {r.outcome for r in paused.records if r.backend == "plain"} == {"submitted"}
        assert len(needs.seen) == 2 and len(plain.seen) == 4  # nothing run for arcrest
        assert paused.excluded == () and paused.failures == ()  # no server blamed
        counts = director.failing.counts()
        assert counts["failing"] == 0 and counts["tickets"] == 0
        assert len(needs.polled) == polls and plain.polled  # its pilots are not polled
        (error,) = [n for n in collector.notes if n.level == "error"]
        assert error.failure is not None and error.failure.kind == "credential"
        assert error.failure.local and error.endpoint is None
        assert str(site.token) in error.subject and "arcrest" in error.subject
        (status,) = paused.credentials
        assert not status.usable and status.kind == "token" and "expired at" in status.message

        site.fail_file.unlink()  # the renewal works again: renewed before anything is submitted
        site.tick(60)
        back = director.run_iteration()
        assert {r.outcome for r in back.records if r.backend == "arcrest"} == {"submitted"}
        assert back.credentials[0].renewed and len(needs.seen) == 4
        assert len(needs.polled) > polls  # polled again
        assert collector.levels()[-1] == "info"
        assert first.credentials[0].usable
    finally:
        director.close()


def test_each_credential_event_is_one_log_line_and_every_notifier_but_the_log_still_hears_it(
    site: Site,
) -> None:
    """Issue 42: with the default ``log`` notifier, a renewal after an outage came out as
    "renewed" and again as "[info] ... works again"; the outage as its error line and again as
    "[error] ...". The director's line is the one in the log; mail and files still get all."""
    needs = TokenBackend("arcrest", ("token",))
    collector = Collector()
    doc = {
        "director": {"cycle_seconds": 60, "command_timeout": 20, "ticket_expiry": 120},
        "demand": {"static": {"arcrest": 1}},
        "credentials": {"bearer_token": {"path": str(site.token), "renew": site.renew()}},
    }
    lines: list[tuple[str, str]] = []
    sink = logger.add(
        lambda m: lines.append((m.record["level"].name, m.record["message"])), level="INFO"
    )
    director = director_for(doc, needs, collector, clock=site.clock)
    needs.context = director.context
    try:
        site.issue(left=60)  # renewed at the first iteration: one line, no notification
        director.run_iteration()
        site.tick(3 * HOUR)
        site.fail_file.touch()
        director.run_iteration()  # unusable: the error line; the error goes to the notifiers
        site.tick(200)
        director.run_iteration()  # past ticket_expiry: the alarm is news, the log writes it
        site.fail_file.unlink()
        site.tick(60)
        director.run_iteration()  # renewed and works again: one line
    finally:
        director.close()
        logger.remove(sink)
    token = str(site.token)
    about = [(level, text) for level, text in lines if token in text]
    renewed = [text for level, text in about if "renewed" in text and level == "INFO"]
    assert len(renewed) == 2  # the first iteration's and the recovery's, once each
    assert [n.level for n in collector.notes] == ["error", "alarm", "info"]
    assert collector.notes[0].logged and collector.notes[2].logged
    assert not collector.notes[1].logged
    by_notifier = [(level, text) for level, text in about if text.startswith("[")]
    assert by_notifier == [("CRITICAL", f"[alarm] {collector.notes[1].subject}")]
    errors = [text for level, text in about if level == "ERROR"]
    assert len(errors) == 2 and all("submit nothing this iteration" in t for t in errors)
