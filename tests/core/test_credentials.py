"""Managed credentials: the ``x509_proxy`` plugin reads a real proxy's lifetime with
``cryptography`` and renews it with a real command; the director pauses the backends that need
an unusable credential (a local fault of kind ``credential``), tells people once per episode,
and hands the proxy to the backends' commands."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gridgate.core import hookimpl
from gridgate.core.builtin.x509_proxy import X509Proxy
from gridgate.core.clock import FakeClock, write_file_time
from gridgate.core.config import ConfigError
from gridgate.core.credentials import CredentialError, CredentialPlugin, Validity, credential_schema
from gridgate.core.engine.config_checks import config_warnings
from gridgate.core.engine.director import Director, summary_json
from gridgate.core.engine.loader import build_plugin_manager
from gridgate.core.kinds import KINDS, kind_table
from gridgate.core.model import (
    BackendInfo,
    CredentialRegistry,
    CredentialStatus,
    Endpoint,
    IterationInfo,
    JobStatus,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.plugins import PluginContext
from gridgate.core.runner import run
from gridgate.core.stores.memory import MemoryState
from gridgate.core.testing import Collector, build_plugin, make_config, plugin_manager_with

START = 1_700_000_000.0  # FakeClock's default start
HOUR = 3600.0

# --- a real proxy tool: the tests issue proxies with it, and it is the renew command ----------

PROXY_TOOL = '''"""Issue an RFC 3820 proxy signed by a user certificate (a stand-in for arcproxy)."""
import argparse, datetime, os, sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

# ProxyCertInfo (1.3.6.1.5.5.7.1.14), policy id-ppl-inheritAll (1.3.6.1.5.5.7.21.1)
PROXY_CERT_INFO = x509.ObjectIdentifier("1.3.6.1.5.5.7.1.14")
INHERIT_ALL = bytes.fromhex("300c300a06082b06010505071501")


def issue_proxy(out, usercert, userkey, not_after, not_before=None):
    user = x509.load_pem_x509_certificate(Path(usercert).read_bytes())
    user_key = serialization.load_pem_private_key(Path(userkey).read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    serial = x509.random_serial_number()
    subject = x509.Name([*user.subject, x509.NameAttribute(NameOID.COMMON_NAME, str(serial % 10**9))])
    utc = datetime.timezone.utc
    start = datetime.datetime.fromtimestamp(not_after - 12 * 3600 if not_before is None else not_before, utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(user.subject)
            .public_key(key.public_key()).serial_number(serial)
            .not_valid_before(start).not_valid_after(datetime.datetime.fromtimestamp(not_after, utc))
            .add_extension(x509.UnrecognizedExtension(PROXY_CERT_INFO, INHERIT_ALL), critical=True)
            .sign(user_key, hashes.SHA256()))
    pem = (cert.public_bytes(serialization.Encoding.PEM)
           + key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                               serialization.NoEncryption())
           + user.public_bytes(serialization.Encoding.PEM))
    tmp = Path(f"{out}.{os.getpid()}.tmp")
    tmp.write_bytes(pem)
    tmp.chmod(0o600)
    os.replace(tmp, out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("out", "cert", "key", "clock", "log", "fail_if"):
        parser.add_argument("--" + name.replace("_", "-"), default="")
    parser.add_argument("--hours", type=float, default=12)
    parser.add_argument("--hang", action="store_true")
    args = parser.parse_args()
    if args.log:
        with open(args.log, "a", encoding="utf-8") as log:
            log.write("renew\\n")
    print("Your identity: /DC=org/DC=gridgate-test/CN=robot", flush=True)
    if args.hang:
        import time
        time.sleep(600)
    if args.fail_if and os.path.exists(args.fail_if):
        print("ERROR: Failed to load user certificate: the certificate has expired", file=sys.stderr)
        sys.exit(1)
    from gridgate.core.clock import file_time
    issue_proxy(args.out, args.cert, args.key, file_time(args.clock) + args.hours * 3600)
    print("Proxy generation succeeded")
'''


def _load_tool(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("proxy_tool", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _iso(ts: float) -> str:
    return _dt(ts).strftime("%Y-%m-%d %H:%M:%S UTC")


class Grid:
    """A test CA, a user certificate signed by it, the proxy tool, and a fake clock whose time
    the tool reads from a clock file."""

    def __init__(self, folder: Path, user_not_after: float = START + 365 * 24 * HOUR) -> None:
        self.folder = folder
        self.clock = FakeClock(START)
        self.clock_file = folder / "clock"
        self.log = folder / "log"
        self.fail_file = folder / "renewal-fails"
        self.proxy = folder / "proxy.pem"
        self.tool_path = folder / "proxy_tool.py"
        self.tool_path.write_text(PROXY_TOOL, encoding="utf-8")
        self.tool = _load_tool(self.tool_path)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name(
            [
                x509.NameAttribute(NameOID.DOMAIN_COMPONENT, "org"),
                x509.NameAttribute(NameOID.COMMON_NAME, "gridgate test CA"),
            ]
        )
        self.ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(1)
            .not_valid_before(_dt(START - 30 * 24 * HOUR))
            .not_valid_after(_dt(START + 3650 * 24 * HOUR))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        user_key = ec.generate_private_key(ec.SECP256R1())
        user_name = x509.Name(
            [
                x509.NameAttribute(NameOID.DOMAIN_COMPONENT, "org"),
                x509.NameAttribute(NameOID.COMMON_NAME, "robot"),
            ]
        )
        user = (
            x509.CertificateBuilder()
            .subject_name(user_name)
            .issuer_name(ca_name)
            .public_key(user_key.public_key())
            .serial_number(2)
            .not_valid_before(_dt(START - 24 * HOUR))
            .not_valid_after(_dt(user_not_after))
            .sign(ca_key, hashes.SHA256())
        )
        self.usercert, self.userkey = folder / "usercert.pem", folder / "userkey.pem"
        self.usercert.write_bytes(user.public_bytes(serialization.Encoding.PEM))
        self.userkey.write_bytes(
            user_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        (folder / "certificates").mkdir()
        (folder / "certificates" / "ca.pem").write_bytes(
            self.ca.public_bytes(serialization.Encoding.PEM)
        )
        self.tick()

    def tick(self, seconds: float = 0.0) -> None:
        """Move the fake clock (and the tool's clock file with it)."""
        self.clock.advance(seconds)
        write_file_time(self.clock_file, self.clock.time())

    def issue(self, left: float, path: Path | None = None) -> float:
        """Write a proxy with ``left`` seconds of validity from now; returns its end."""
        end = self.clock.time() + left
        self.tool.issue_proxy(str(path or self.proxy), str(self.usercert), str(self.userkey), end)
        return end

    def renew(self, *extra: str) -> list[str]:
        return [
            sys.executable,
            str(self.tool_path),
            "--out",
            str(self.proxy),
            "--cert",
            str(self.usercert),
            "--key",
            str(self.userkey),
            "--clock",
            str(self.clock_file),
            "--log",
            str(self.log),
            "--fail-if",
            str(self.fail_file),
            *extra,
        ]

    def section(self, **changes: Any) -> dict[str, Any]:
        renew = changes.get("renew", self.renew())
        return {
            "path": str(self.proxy),
            "min_lifetime": HOUR,
            "renew": renew,
            # a renewal's limit, only where there is a renewal (else a config error)
            **({"timeout": 20} if renew else {}),
            **changes,
        }

    def events(self) -> list[str]:
        return self.log.read_text(encoding="utf-8").splitlines() if self.log.exists() else []


@pytest.fixture
def grid(tmp_path: Path) -> Grid:
    return Grid(tmp_path)


def plugin(grid: Grid, **changes: Any) -> X509Proxy:
    return build_plugin(
        X509Proxy,
        grid.section(**changes),
        clock=grid.clock,
        name="x509_proxy",
        config={"director": {"cycle_seconds": 60, "command_timeout": 120}},
    )


def check(credential: object, timeout: float = 120) -> CredentialStatus:
    registry = CredentialRegistry()
    with plugin_manager_with(credential) as pm:
        pm.hook.gridgate_check_credentials(
            iteration=IterationInfo(1, START), timeout=timeout, credentials=registry
        )
    (status,) = registry.statuses
    return status


# --- the hooks, on the plugin alone ----------------------------------------------------------


def test_gridgate_check_credentials_reports_a_valid_proxy_and_runs_no_renewal(grid: Grid) -> None:
    end = grid.issue(left=5 * HOUR)
    status = check(plugin(grid))
    assert (status.name, status.kind, status.usable, status.path) == (
        "x509_proxy",
        "x509",
        True,
        str(grid.proxy),
    )
    assert status.expires == end and status.command is None and not status.at_risk
    assert _iso(end) in status.message
    assert grid.events() == []  # enough left: the renew command was not run


def test_gridgate_check_credentials_renews_a_proxy_with_less_than_min_lifetime_left(
    grid: Grid,
) -> None:
    grid.issue(left=HOUR - 60)
    status = check(plugin(grid))
    assert grid.events() == ["renew"]
    assert status.usable and status.renewed and status.command is not None and status.command.ok
    assert status.expires == grid.clock.time() + 12 * HOUR  # what the renewal wrote
    assert "Proxy generation succeeded" in status.command.stdout
    # a real proxy: signed by the user certificate it carries, itself signed by the test CA
    proxy, user = x509.load_pem_x509_certificates(grid.proxy.read_bytes())
    proxy.verify_directly_issued_by(user)
    user.verify_directly_issued_by(grid.ca)
    assert proxy.extensions.get_extension_for_oid(
        x509.ObjectIdentifier("1.3.6.1.5.5.7.1.14")
    ).critical


def test_gridgate_check_credentials_a_missing_proxy_whose_renewal_fails_is_unusable(
    grid: Grid,
) -> None:
    grid.fail_file.touch()
    status = check(plugin(grid))
    assert not status.usable and status.expires is None
    assert status.message == (
        f"X.509 proxy {grid.proxy} does not exist; the renewal failed (exit code 1)"
    )
    assert status.command is not None and "certificate has expired" in status.command.stderr


def test_gridgate_check_credentials_runs_the_renewal_under_its_deadline(grid: Grid) -> None:
    end = grid.issue(left=-60)
    status = check(plugin(grid, renew=grid.renew("--hang"), timeout=1))
    assert status.command is not None and status.command.timed_out
    assert "Your identity" in status.command.stdout  # what it printed before the kill is kept
    assert not status.usable and status.expires == end
    assert (
        f"expired at {_iso(end)} (1 minute ago); the renewal failed (timed out after"
        in status.message
    )


def test_gridgate_check_credentials_the_section_timeout_falls_back_to_the_directors(
    grid: Grid,
) -> None:
    grid.issue(left=-60)
    status = check(plugin(grid, renew=grid.renew("--hang"), timeout=None), timeout=1)
    assert status.command is not None and status.command.timed_out and status.command.duration < 60


def test_gridgate_credential_env_answers_from_the_config_without_a_check(grid: Grid) -> None:
    # as `gridgate pilots cancel` does: plugins built from the config, no iteration, no file
    config = make_config(
        {"state": {"driver": "memory"}, "credentials": {"x509_proxy": grid.section()}}
    )
    context = PluginContext(clock=grid.clock, config=config.data)
    pm, plugins = build_plugin_manager(config.data, context)
    assert not grid.proxy.exists()
    assert context.credential_env("x509") == {"X509_USER_PROXY": str(grid.proxy)}
    assert pm.hook.gridgate_credential_env(kind="x509") == {"X509_USER_PROXY": str(grid.proxy)}
    assert context.credential_env("token") == {}  # no plugin of that kind: unmanaged
    assert pm.hook.gridgate_credential_env(kind="token") is None


def test_credential_env_is_empty_without_a_credential_plugin_or_a_plugin_manager() -> None:
    config = make_config({"state": {"driver": "memory"}})
    context = PluginContext(config=config.data)
    assert context.credential_env("x509") == {}  # not built yet
    build_plugin_manager(config.data, context)
    assert context.credential_env("x509") == {}


def test_relative_paths_are_the_config_files_folders_and_the_renewal_runs_there(
    grid: Grid, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the director's working folder is not the config's
    renew = [
        sys.executable,
        str(grid.tool_path),
        "--out",
        "proxy.pem",
        "--cert",
        "usercert.pem",
        "--key",
        "userkey.pem",
        "--clock",
        str(grid.clock_file),
    ]
    doc = {
        "state": {"driver": "memory"},
        "credentials": {"x509_proxy": {"path": "proxy.pem", "renew": renew}},
    }
    config = make_config(doc)
    context = PluginContext(
        clock=grid.clock, config=config.data, config_path=grid.folder / "site.yaml"
    )
    pm, _plugins = build_plugin_manager(config.data, context)
    assert context.credential_env("x509") == {"X509_USER_PROXY": str(grid.proxy)}
    registry = CredentialRegistry()
    pm.hook.gridgate_check_credentials(
        iteration=IterationInfo(1, START), timeout=30, credentials=registry
    )
    (status,) = registry.statuses
    assert status.usable and status.renewed and status.path == str(grid.proxy)
    assert grid.proxy.exists() and not (elsewhere / "proxy.pem").exists()


def test_without_a_config_file_a_relative_path_is_the_working_folders(
    grid: Grid, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(grid.folder)
    proxy = build_plugin(X509Proxy, {"path": "proxy.pem"}, clock=grid.clock)
    assert proxy.env() == {"X509_USER_PROXY": str(grid.proxy)}


# --- reading the lifetime ------------------------------------------------------------------------


def test_the_lifetime_is_the_first_certificate_and_no_longer_than_its_issuer(
    tmp_path: Path,
) -> None:
    short = Grid(tmp_path, user_not_after=START + 2 * HOUR)  # the user certificate ends first
    short.issue(left=12 * HOUR)
    valid = plugin(short).read()
    assert valid.not_after == START + 2 * HOUR
    assert (
        "its issuer" in valid.detail and "CN=robot" in valid.detail and "ends first" in valid.detail
    )
    status = check(plugin(short, renew=[]))
    assert status.usable and status.expires == START + 2 * HOUR
    short.tick(3 * HOUR)
    status = check(plugin(short, renew=[]))
    assert not status.usable and f"expired at {_iso(START + 2 * HOUR)}" in status.message
    assert valid.detail in status.message


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is empty"),
        (b"not a certificate at all\n", "holds no PEM certificate"),
        (
            b"-----BEGIN PRIVATE KEY-----\nMIGHAgEA\n-----END PRIVATE KEY-----\n",
            "holds no PEM certificate",
        ),
        (
            b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
            "holds a PEM certificate that cannot be read",
        ),
    ],
)
def test_a_file_that_is_not_a_proxy_is_unusable_with_a_clear_message(
    grid: Grid, content: bytes, problem: str
) -> None:
    grid.proxy.write_bytes(content)
    grid.proxy.chmod(0o600)
    status = check(plugin(grid, renew=[]))
    assert not status.usable and status.expires is None
    assert status.message.startswith(f"X.509 proxy {grid.proxy} {problem}")
    assert status.message.endswith("; no renew command is configured")


def test_an_unreadable_proxy_is_unusable(grid: Grid) -> None:
    grid.proxy.mkdir()  # readable by nobody as a file, root included
    status = check(plugin(grid, renew=[]))
    assert not status.usable and "is a folder, not a regular file" in status.message


def test_a_fifo_in_place_of_the_proxy_is_unusable_at_once(grid: Grid) -> None:
    """Issue 31, item 1: open() on a FIFO blocked the director for ever before its first
    iteration; now the check answers at once, naming what the file is."""
    os.mkfifo(grid.proxy, 0o600)
    got: list[CredentialStatus] = []
    worker = threading.Thread(target=lambda: got.append(check(plugin(grid, renew=[]))), daemon=True)
    worker.start()
    worker.join(60)
    try:
        assert not worker.is_alive(), "the credential check blocked on a FIFO"
        (status,) = got
        assert not status.usable and "is a FIFO, not a regular file" in status.message
    finally:
        if worker.is_alive():
            os.close(os.open(grid.proxy, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_proxy_open_to_its_group_or_others_is_refused_saying_mode_and_fix(
    grid: Grid, mode: int
) -> None:
    """Issue 31, item 4: ssh, GSI and arcproxy refuse a loose credential file; so does this."""
    grid.issue(left=5 * HOUR)
    grid.proxy.chmod(mode)
    status = check(plugin(grid, renew=[]))
    assert not status.usable
    assert f"has mode {mode:04o}" in status.message and "mode 0600 or 0400" in status.message


def test_a_proxy_owned_by_another_user_is_refused_naming_both_owners(grid: Grid) -> None:
    grid.issue(left=5 * HOUR)
    os.chown(grid.proxy, 65534, -1)
    status = check(plugin(grid, renew=[]))
    assert not status.usable
    assert "is owned by uid 65534" in status.message and f"uid {os.geteuid()}" in status.message


def test_a_proxy_not_yet_valid_is_unusable(grid: Grid) -> None:
    grid.tool.issue_proxy(
        str(grid.proxy), str(grid.usercert), str(grid.userkey), START + 12 * HOUR, START + HOUR
    )
    status = check(plugin(grid, renew=[]))
    assert not status.usable and f"is not valid before {_iso(START + HOUR)}" in status.message


def test_an_expired_proxy_with_no_renew_command_is_only_checked(grid: Grid) -> None:
    end = grid.issue(left=-5)
    status = check(plugin(grid, renew=[]))
    assert not status.usable and status.command is None
    assert (
        status.message
        == f"X.509 proxy {grid.proxy} expired at {_iso(end)} (5 seconds ago); no renew command is configured"
    )


# --- the config section -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "where", "says"),
    [
        (
            {"path": "/p", "renew": "arcproxy -C usercert.pem"},
            "credentials.x509_proxy.renew",
            "is not of type 'array'",
        ),
        (
            {"path": "/p", "renew": ["arcproxy", 12]},
            "credentials.x509_proxy.renew[1]",
            "is not of type 'string'",
        ),
        (
            {"path": "/p", "min_lifetime": -1},
            "credentials.x509_proxy.min_lifetime",
            "less than the minimum",
        ),
        (
            {"path": "/p", "timeout": 0},
            "credentials.x509_proxy.timeout",
            "less than or equal to the minimum",
        ),
        ({"min_lifetime": 60}, "credentials.x509_proxy", "'path' is a required property"),
        ({"path": ""}, "credentials.x509_proxy.path", "should be non-empty"),
        (
            {"path": "/p", "renew": ["", "-P"]},
            "credentials.x509_proxy.renew[0]",
            "the renewal program is empty",
        ),
        ({"path": "/p", "lifetime": 5}, "credentials.x509_proxy.lifetime", "unknown key"),
        # the timeout of a renewal that is never run: it validated and limited nothing
        (
            {"path": "/p", "timeout": 30},
            "credentials.x509_proxy.timeout",
            "timeout limits the renew command, but renew is empty",
        ),
    ],
)
def test_a_bad_credentials_section_is_a_config_error_naming_the_key(
    section: dict[str, Any], where: str, says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        make_config({"state": {"driver": "memory"}, "credentials": {"x509_proxy": section}})
    assert any(
        f": {where}: " in line and says in line for line in str(caught.value).splitlines()
    ), str(caught.value)


def test_the_section_gets_its_defaults_and_a_shell_line_as_renew_is_a_warning() -> None:
    config = make_config(
        {
            "state": {"driver": "memory"},
            "credentials": {"x509_proxy": {"path": "/p", "renew": ["arcproxy -C usercert.pem"]}},
        }
    )
    assert config["credentials"]["x509_proxy"] == {
        "path": "/p",
        "min_lifetime": 3600,
        "renew": ["arcproxy -C usercert.pem"],
        "timeout": None,
    }
    (warning,) = config_warnings(config)
    assert (
        warning.path == ("credentials", "x509_proxy", "renew", 0)
        and "one item per word" in warning.message
    )


def test_an_unknown_credential_plugin_is_a_load_error_naming_it() -> None:
    with pytest.raises(
        ConfigError,
        match=r"credentials\.token_files: plugin 'token_files' of group "
        r"gridgate\.credentials: not installed \(installed: bearer_token, x509_proxy\)",
    ):
        make_config({"state": {"driver": "memory"}, "credentials": {"token_files": {"path": "/t"}}})


def test_the_credential_kind_is_local_never_excluded_and_never_an_alarm_to_a_server() -> None:
    kind = KINDS["credential"]
    assert (
        kind.local,
        kind.exclude,
        kind.transient,
        kind.notify,
        kind.escalated,
        kind.counts_toward_alarms,
    ) == (True, False, False, True, False, False)
    row = next(r for r in kind_table() if r["kind"] == "credential")
    assert (row["excluded"], row["alarms"], row["local"]) == ("no", "no", "yes")


# --- the director, end to end ---------------------------------------------------------------------


class ProxyBackend:
    """A backend whose commands need an X.509 proxy: it submits by running a real program with
    the environment ``context.credential_env("x509")`` gives, and records what the program saw
    in the grid's log (after the renewals the proxy tool writes there)."""

    def __init__(
        self, log: Path, name: str = "arcish", credentials: Sequence[str] = ("x509",)
    ) -> None:
        self.log, self.name, self.credentials = log, name, tuple(credentials)
        self.endpoints = (Endpoint(name, "ce01"), Endpoint(name, "ce02"))
        self.context: PluginContext | None = None
        self.status_calls: list[str] = []
        self.submitted: list[str] = []
        #: (demand group, the proxy its submission's program saw)
        self.by_group: list[tuple[str, str]] = []
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
        assert self.context is not None
        env = dict(os.environ)
        for kind in self.credentials:
            env.update(self.context.credential_env(kind))
        job = uuid.uuid4().hex[:8]
        result = run(
            [
                sys.executable,
                "-c",
                f"import os; print(os.environ.get('X509_USER_PROXY', '-')); print('JOBID {job}')",
            ],
            timeout=timeout,
            env=env,
        )
        seen = result.stdout.splitlines()[0] if result.ok else "?"
        with self.lock:
            self.submitted.append(seen)
            self.by_group.append((request.group, seen))
            with self.log.open("a", encoding="utf-8") as log:
                log.write(f"submit {self.name} {seen}\n")
        return SubmitResult(
            endpoint, ok=result.ok, job_ids=(job,) if result.ok else (), command=result
        )

    @hookimpl
    def gridgate_job_status(
        self, endpoint: Endpoint, job_ids: Sequence[str], timeout: float
    ) -> StatusResult | None:
        if endpoint.backend != self.name:
            return None
        with self.lock:
            self.status_calls.append(endpoint.name)
        return StatusResult(
            endpoint, ok=True, statuses={j: JobStatus(j, "waiting") for j in job_ids}
        )


def site(grid: Grid, *backends: str, pilots: int = 2, **director: Any) -> dict[str, Any]:
    return {
        "director": {
            "cycle_seconds": 60,
            "command_timeout": 20,
            "failing_expiry": 600,
            "ticket_expiry": 1800,
            "max_threads": 2,
            **director,
        },
        "state": {"driver": "memory"},
        "demand": {"static": {name: pilots for name in backends or ("arcish",)}},
        "credentials": {"x509_proxy": grid.section()},
    }


def director_for(
    grid: Grid,
    doc: dict[str, Any],
    *backends: ProxyBackend,
    state: Any = None,
    collector: Collector | None = None,
    others: Sequence[object] = (),
) -> tuple[Director, Collector]:
    collector = collector or Collector()
    director = Director(
        make_config(doc),
        clock=grid.clock,
        extra_plugins=[*backends, collector, *others],
        state=state or MemoryState(clock=grid.clock),
    )
    for backend in backends:
        backend.context = director.context  # an in-process backend uses the director's context
    return director, collector


def submitted(summary: Any) -> int:
    return sum(r.pilots for r in summary.records if r.outcome == "submitted")


def credential_notes(collector: Collector) -> list[Any]:
    return [n for n in collector.notes if n.failure is not None and n.failure.kind == "credential"]


def test_an_expired_proxy_whose_renewal_fails_pauses_the_backend_with_one_error_an_alarm_and_a_notice(
    grid: Grid,
) -> None:
    backend = ProxyBackend(grid.log)
    director, collector = director_for(grid, site(grid), backend)
    try:
        grid.issue(left=2 * HOUR)
        first = director.run_iteration()
        assert submitted(first) == 2 and backend.submitted == [str(grid.proxy)] * 2
        assert grid.events().count("renew") == 0

        # the proxy runs out and the renewal fails (the robot certificate expired, say)
        end = grid.issue(left=-30)
        grid.fail_file.touch()
        summaries = []
        for _ in range(6):  # 5 minutes of failing iterations: more than stall_iterations
            grid.tick(60)
            summaries.append(director.run_iteration())
        assert all(submitted(s) == 0 for s in summaries)
        assert {(r.outcome, r.failure_kind) for s in summaries for r in s.records} == {
            ("skipped", "credential")
        }
        assert all(s.excluded == () and s.failures == () for s in summaries)  # no server blamed
        counts = director.failing.counts()
        assert counts["failing"] == 0 and counts["tickets"] == 0
        assert backend.status_calls == []  # its pilots are not polled while it is paused
        assert grid.events().count("renew") == 6 and len(backend.submitted) == 2

        errors = [n for n in collector.notes if n.level == "error"]
        # one error for the episode, not one per iteration (nor a stall error on top)
        assert len(errors) == 1 and collector.levels() == ["error"]
        (error,) = errors
        assert (
            error.failure is not None and error.failure.kind == "credential" and error.failure.local
        )
        assert (
            error.endpoint is None
            and str(grid.proxy) in error.subject
            and "arcish submits nothing" in error.subject
        )
        assert f"File: {grid.proxy}" in error.body and f"Ends: {_iso(end)}" in error.body
        assert "Renewal: " in error.body and "certificate has expired" in error.body  # its output
        assert "no ticket is asked of a server's operators" in error.body
        assert summaries[0].credentials[0].usable is False
        doc = json.loads(summary_json(summaries[0]))
        assert (
            doc["credentials"][0]["usable"] is False
            and doc["credentials"][0]["command"]["returncode"] == 1
        )

        # it lasts past ticket_expiry (1800 s): one alarm, then none until failing_expiry more
        while grid.clock.time() - (START + 90) < 1800:
            grid.tick(60)
            director.run_iteration()
        assert collector.levels() == ["error", "alarm"]
        alarm = collector.notes[-1]
        assert (
            "unusable at least for 30 minutes" in alarm.body and alarm.failure.kind == "credential"
        )
        grid.tick(60)
        director.run_iteration()
        assert collector.levels() == ["error", "alarm"]

        # the renewal works again: the proxy is renewed before anything is submitted
        grid.fail_file.unlink()
        grid.log.unlink()
        grid.tick(60)
        back = director.run_iteration()
        assert submitted(back) == 2
        assert grid.events() == [
            "renew",
            f"submit arcish {grid.proxy}",
            f"submit arcish {grid.proxy}",
        ]
        assert backend.status_calls  # polled again (the first two pilots were waiting)
        assert collector.levels() == ["error", "alarm", "info"]
        notice = collector.notes[-1]
        assert "works again" in notice.subject and "arcish" in notice.body
        assert director.state.items("credential/episode/") == []
        grid.tick(60)
        director.run_iteration()
        assert collector.levels() == ["error", "alarm", "info"]
    finally:
        director.close()


def test_a_proxy_near_expiry_is_renewed_before_any_submission_and_handed_to_the_commands(
    grid: Grid,
) -> None:
    backend = ProxyBackend(grid.log)
    director, collector = director_for(grid, site(grid, pilots=3), backend)
    try:
        grid.issue(left=HOUR / 2)  # below min_lifetime: renewed first
        summary = director.run_iteration()
        assert submitted(summary) == 3
        assert grid.events() == ["renew"] + [f"submit arcish {grid.proxy}"] * 3
        (status,) = summary.credentials
        assert status.renewed and status.expires == grid.clock.time() + 12 * HOUR
        assert collector.notes == []
    finally:
        director.close()


def test_a_backend_that_needs_no_credential_keeps_submitting_while_the_proxy_is_unusable(
    grid: Grid,
) -> None:
    needs, plain = ProxyBackend(grid.log), ProxyBackend(grid.log, name="plain", credentials=())
    director, collector = director_for(grid, site(grid, "arcish", "plain"), needs, plain)
    try:
        grid.fail_file.touch()  # no proxy at all, and no way to make one
        summary = director.run_iteration()
        outcomes = {(r.backend, r.outcome, r.failure_kind) for r in summary.records}
        assert outcomes == {("arcish", "skipped", "credential"), ("plain", "submitted", "")}
        assert needs.submitted == [] and plain.submitted == ["-", "-"]
        (error,) = collector.notes
        assert "Ends: unknown" in error.body and "does not exist" in error.body
        assert "arcish submits nothing" in error.subject and "plain" not in error.subject
    finally:
        director.close()


def test_a_failed_renewal_of_a_proxy_that_ends_before_the_next_could_succeed_warns_once_and_submits(
    grid: Grid,
) -> None:
    backend = ProxyBackend(grid.log)
    # cycle 60 s + renewal deadline 20 s: a proxy with less than 80 s left is at risk
    director, collector = director_for(grid, site(grid), backend)
    try:
        grid.fail_file.touch()
        grid.issue(left=40 * 60)  # short, renewal fails, but 40 minutes are left: log only
        assert submitted(director.run_iteration()) == 2 and collector.notes == []
        end = grid.issue(left=75)  # less than 60 + 20 s left
        summary = director.run_iteration()
        assert submitted(summary) == 2 and summary.credentials[0].at_risk
        (warning,) = collector.notes
        assert warning.level == "error" and "expires soon and its renewal failed" in warning.subject
        assert f"Ends: {_iso(end)}" in warning.body and "certificate has expired" in warning.body
        grid.tick(30)
        assert submitted(director.run_iteration()) == 2
        assert len(collector.notes) == 1  # once per proxy end time, not per iteration
        grid.tick(60)  # now it has expired: the episode's error
        assert submitted(director.run_iteration()) == 0
        assert (
            collector.levels() == ["error", "error"] and "unusable" in collector.notes[-1].subject
        )
    finally:
        director.close()


def test_two_directors_on_one_redis_send_one_error_and_one_notice(grid: Grid, redis_server) -> None:
    from gridgate.core.stores.redis import RedisState

    prefix = f"cred-{uuid.uuid4().hex[:8]}:"
    collector = Collector()  # one mailbox for both
    pairs = []
    for _ in range(2):
        backend = ProxyBackend(grid.log)
        state = RedisState({"url": redis_server.url, "prefix": prefix}, clock=grid.clock)
        pairs.append(director_for(grid, site(grid), backend, state=state, collector=collector))
    try:
        grid.issue(left=-1)
        grid.fail_file.touch()
        for _ in range(3):
            for director, _ in pairs:
                assert submitted(director.run_iteration()) == 0
            grid.tick(60)
        assert collector.levels() == ["error"]
        grid.fail_file.unlink()
        for director, _ in pairs:
            assert submitted(director.run_iteration()) == 2
        assert collector.levels() == ["error", "info"]
    finally:
        for director, _ in pairs:
            director.close()


class Order:
    def __init__(self) -> None:
        self.events: list[str] = []

    @hookimpl
    def gridgate_demand(self, iteration, demand):
        self.events.append("demand")

    @hookimpl
    def gridgate_check_credentials(self, iteration, timeout, credentials):
        self.events.append("check_credentials")

    @hookimpl(tryfirst=True)
    def gridgate_job_status(self, endpoint, job_ids, timeout):
        self.events.append("job_status")

    @hookimpl(tryfirst=True)
    def gridgate_submit(self, endpoint, request, timeout):
        self.events.append("submit")


def test_gridgate_check_credentials_is_called_once_per_iteration_after_demand_before_polls_and_submits(
    grid: Grid,
) -> None:
    order = Order()
    backend = ProxyBackend(grid.log)
    grid.issue(left=5 * HOUR)
    director, _ = director_for(grid, site(grid), backend, others=[order])
    try:
        director.run_iteration()
        first = list(order.events)
        assert first == ["demand", "check_credentials", "submit", "submit"]
        order.events.clear()
        director.run_iteration()  # now there are pilots to poll (one call per endpoint with some)
        polls = order.events.count("job_status")
        assert polls >= 1
        assert order.events == [
            "demand",
            "check_credentials",
            *["job_status"] * polls,
            "submit",
            "submit",
        ]
    finally:
        director.close()


# --- another kind: a token file is a small subclass ---------------------------------------------


class TokenFile(CredentialPlugin):
    """What docs/plugins.md shows: a WLCG bearer token in a file, its lifetime from ``exp``."""

    kind = "token"
    env_var = "BEARER_TOKEN_FILE"
    what = "bearer token"
    config_schema = credential_schema("A WLCG bearer token in a file.", min_lifetime=600)

    def validity(self, data: bytes) -> Validity:
        import base64

        try:
            payload = data.strip().split(b".")[1]
            claims = json.loads(base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))
            return Validity(not_before=float(claims.get("nbf", 0)), not_after=float(claims["exp"]))
        except (IndexError, ValueError, KeyError, TypeError):
            raise CredentialError("holds no JWT with an exp claim") from None


def _jwt(claims: dict[str, Any]) -> bytes:
    import base64

    def part(value: dict[str, Any]) -> bytes:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=")

    return part({"alg": "none"}) + b"." + part(claims) + b"."


def test_a_token_file_plugin_is_a_small_subclass_of_the_same_hooks(tmp_path: Path) -> None:
    clock = FakeClock(START)
    token = tmp_path / "bt"
    refresh = [
        sys.executable,
        "-c",
        "import sys; from pathlib import Path; "
        f"Path(sys.argv[1]).write_bytes({_jwt({'exp': START + 3000})!r}); "
        "Path(sys.argv[1]).chmod(0o600)",
        str(token),
    ]
    token.write_bytes(_jwt({"exp": START + 300}))
    token.chmod(0o600)
    plugin = build_plugin(
        TokenFile, {"path": str(token), "renew": refresh}, clock=clock, name="token_file"
    )
    status = check(plugin)
    assert (status.kind, status.usable, status.renewed, status.expires) == (
        "token",
        True,
        True,
        START + 3000,
    )
    with plugin_manager_with(plugin) as pm:
        assert pm.hook.gridgate_credential_env(kind="token") == {"BEARER_TOKEN_FILE": str(token)}
        assert pm.hook.gridgate_credential_env(kind="x509") is None
    token.write_text("garbage")
    status = check(build_plugin(TokenFile, {"path": str(token)}, clock=clock, name="token_file"))
    assert not status.usable and status.message.startswith(f"bearer token {token} holds no JWT")


# --- named credentials: several VOs on one CE --------------------------------------------------


def two_vos(grid: Grid) -> tuple[Director, Collector, ProxyBackend, Path]:
    """A director of one endpoint and two demand groups, each with its own named proxy (renewed
    by nothing: the test expires and restores them by hand); atlas's proxy is issued for 5 h,
    lhcb's (the returned path) is left to the test."""
    lhcb = grid.folder / "lhcb.pem"
    doc = site(grid)
    doc["credentials"] = {
        "atlas-proxy": {"kind": "x509_proxy", "path": str(grid.proxy), "min_lifetime": HOUR},
        "lhcb-proxy": {"kind": "x509_proxy", "path": str(lhcb), "min_lifetime": HOUR},
    }
    doc["demand"] = {
        "static": {
            "arcish": [
                {"group": "atlas", "pilots": 2, "credential": "atlas-proxy"},
                {"group": "lhcb", "pilots": 2, "credential": "lhcb-proxy"},
            ]
        }
    }
    backend = ProxyBackend(grid.log)
    backend.endpoints = (Endpoint("arcish", "ce01"),)
    director, collector = director_for(grid, doc, backend)
    grid.issue(left=5 * HOUR)
    return director, collector, backend, lhcb


def test_two_groups_on_one_endpoint_each_submit_with_their_own_named_proxy(grid: Grid) -> None:
    director, collector, backend, lhcb = two_vos(grid)
    try:
        grid.issue(left=5 * HOUR, path=lhcb)
        first = director.run_iteration()
        assert submitted(first) == 4
        assert sorted(backend.by_group) == [
            ("atlas", str(grid.proxy)),
            ("atlas", str(grid.proxy)),
            ("lhcb", str(lhcb)),
            ("lhcb", str(lhcb)),
        ]
        assert {s.name for s in first.credentials} == {"atlas-proxy", "lhcb-proxy"}
        assert collector.notes == []
    finally:
        director.close()


def test_one_named_proxy_expiring_pauses_only_its_group_and_is_told_under_its_name(
    grid: Grid,
) -> None:
    director, collector, backend, lhcb = two_vos(grid)
    try:
        grid.issue(left=-30, path=lhcb)  # lhcb's proxy ended; nothing renews it
        summaries = []
        for _ in range(3):
            grid.tick(60)
            summaries.append(director.run_iteration())
        for summary in summaries:
            outcomes = sorted((r.group, r.outcome, r.failure_kind or "") for r in summary.records)
            assert outcomes == [
                ("atlas", "submitted", ""),
                ("atlas", "submitted", ""),
                ("lhcb", "skipped", "credential"),
            ], outcomes
            assert summary.excluded == () and summary.failures == ()  # no server blamed
        # atlas went on, with its own proxy; nothing was sent with lhcb's
        assert backend.by_group == [("atlas", str(grid.proxy))] * 6
        # the endpoint's pilots are still polled (its credential, atlas's first, is usable)
        assert backend.status_calls
        # one error for lhcb's episode, named; atlas's proxy says nothing
        (error,) = credential_notes(collector)
        assert error.level == "error" and "lhcb-proxy" in error.subject
        assert str(lhcb) in error.subject and "atlas-proxy" not in error.subject
        unusable = [s.name for s in summaries[-1].credentials if not s.usable]
        assert unusable == ["lhcb-proxy"]

        grid.issue(left=5 * HOUR, path=lhcb)  # renewed by hand: lhcb submits again, told once
        grid.tick(60)
        back = director.run_iteration()
        assert submitted(back) == 4 and backend.by_group[-4:].count(("lhcb", str(lhcb))) == 2
        notes = credential_notes(collector)
        assert [n.level for n in notes] == ["error", "info"] and "lhcb-proxy" in notes[1].subject
    finally:
        director.close()
