"""What a failed ARC client command means, from the texts the ARC 6.17 client prints.

Each pattern quotes the line it was made from; all of them were printed by the real client
against the private CE the tests start (``shared/reference/arc.md`` section 5, and the tests in
tests/plugins/arc that provoke them). arcsub runs with ``-d VERBOSE`` because its one ERROR
line, ``Job submission aborted because no resource returned any information``, is the same for
an untrusted CA, an unknown DN and a wrong path; the VERBOSE lines tell them apart.

The kinds carry the catalogue's meanings (gridgate.core.kinds). An expired or missing proxy
is ``credential``, a local fault: never the CE's, so no CE leaves rotation for it. What the
site's own configuration gets wrong for every CE (an invalid description, a pilot script that
is not there) is a local ``config`` fault too; what one CE refuses (a queue it does not offer,
our DN, our CA) is that CE's ``config`` or ``auth``.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable, Mapping

from gridgate.core import files
from gridgate.core.files import InputFileError
from gridgate.core.files import shared_folder as shared_folder
from gridgate.core.kinds import KINDS
from gridgate.core.model import CommandResult, Failure
from gridgate.core.patterns import Pattern, PatternTable, clip

__all__ = [
    "HTTP_METHODS",
    "PATTERNS",
    "REST_PATTERNS",
    "REST_TABLE",
    "TABLE",
    "VAGUE",
    "classify",
    "by_exchange",
    "classify_rest",
    "clip",
    "match",
    "proxy_problem",
    "vague",
]

#: ``argv[:1]`` of a REST exchange's evidence (rest/client.py): the HTTP method.
HTTP_METHODS = frozenset({("GET",), ("POST",), ("PUT",), ("DELETE",), ("HEAD",)})

#: Order matters: the first pattern found in the output decides (specific before general).
PATTERNS: tuple[Pattern, ...] = (
    # Proxy expired. Job submission aborted. Please run 'arcproxy'!
    # Cannot find any proxy. This application currently cannot run without a proxy.
    # WARNING: Certificate and key ('usercert.pem' and 'userkey.pem') not found in any of the paths
    # ERROR: Failed configuration initialization
    (
        CREDENTIAL := Pattern(
            "credential",
            re.compile(
                r"Proxy expired|Cannot find any proxy|Certificate and key \('usercert\.pem' and "
                r"'userkey\.pem'\) not found|Failed configuration initialization"
            ),
            "no usable proxy on this machine",
            exclude=False,
            transient=False,
            local=True,
        )
    ),
    # ERROR: Invalid JobDescription: / No job description parser was able to interpret job description
    Pattern(
        "config",
        re.compile(r"Invalid JobDescription|No job description parser was able"),
        "the job description gridgate wrote is invalid (check backends.arc.xrsl)",
        exclude=False,
        transient=False,
        local=True,
    ),
    # ERROR: Cannot find local input file 'WORK/does-not-exist.sh' (run.sh)
    # ERROR: Can not open job description file: nosuchfile.xrsl
    Pattern(
        "config",
        re.compile(r"Cannot find local input file|Can not open job description file"),
        "a file of the pilot is missing on this machine (backends.arc.script)",
        exclude=False,
        transient=False,
        local=True,
    ),
    # ERROR: Failed to establish connection: TCP: GENERIC_ERROR (Failed to connect to localhost(IPv4):18499)
    Pattern(
        "unreachable",
        re.compile(
            r"TCP: GENERIC_ERROR|Failed to connect to|"
            r"Could not resolve|Name or service not known"
        ),
        "nothing answers at the CE's address",
    ),
    # ERROR: Failed to establish connection: TLS: GENERIC_ERROR (SSL error, "wrong version number", ...)
    Pattern(
        "config",
        re.compile(r"wrong version number"),
        "the CE's port does not speak TLS: not an ARC CE's address",
        transient=False,
    ),
    # ERROR: Failed to establish connection: TLS: GENERIC_ERROR (self-signed certificate in certificate chain)
    Pattern(
        "config",
        re.compile(
            r"TLS: GENERIC_ERROR|certificate verify failed|"
            r"self-signed certificate"
        ),
        "this machine does not trust the CE's host certificate (X509_CERT_DIR)",
        transient=False,
    ),
    # VERBOSE: Unexpected response code from delegation endpoint - 403
    # https://localhost:18443/arex (Error 403: User can't be assigned configuration)
    # WARNING: Failed to process jobs - wrong response: 403
    Pattern(
        "auth",
        re.compile(
            r"delegation endpoint - 403|Error 403|wrong response: 403|"
            r"User can't be assigned configuration"
        ),
        "the CE refuses this DN (not in its authorisation groups)",
    ),
    # VERBOSE: Failed to communicate to delegation endpoint.
    # INFO: Unable to submit jobs. Failed to delegate credentials.
    Pattern(
        "auth",
        re.compile(
            r"Failed to communicate to delegation endpoint|"
            r"Failed to delegate credentials"
        ),
        "the CE does not accept this proxy (its CA is not trusted there)",
    ),
    # VERBOSE: ComputingShare (fork) does not match selected queue (nosuchqueue)
    # INFO: Failed to submit all jobs: 500 Requested queue nosuchqueue is not allowed for this user
    (
        QUEUE := Pattern(
            "config",
            re.compile(r"does not match selected queue|Requested queue \S+ is not allowed"),
            "the CE does not offer this queue to this user",
            transient=False,
        )
    ),
)

#: arcsub's ERROR lines for many causes (an untrusted CA, a DN the CE refuses, a queue it does
#: not offer, a wrong path): nothing was submitted, and only ``-d VERBOSE`` says why.
VAGUE = (
    "Job submission aborted because no resource returned any information",
    "One or multiple job descriptions was not submitted",
)


TABLE = PatternTable(PATTERNS)

#: The REST path's failures, read from the exchange's ``stderr`` line (``rest/client.py``'s
#: ``evidence``: ``connect: ...``, ``TLS: ...``, ``HTTP 403 ...``) and the backend's own
#: message; each was seen on the private CE (tests/plugins/arc/rest). Same kinds as the CLI's.
REST_PATTERNS: tuple[Pattern, ...] = (
    CREDENTIAL,
    # no bearer token: none in /tmp/bt_u0 / Token expired: the bearer token from ... ended at
    Pattern(
        "credential",
        re.compile(r"^no bearer token|^Token expired|^Payload credential "),
        "no usable bearer token on this machine",
        exclude=False,
        transient=False,
        local=True,
    ),
    # HTTP 500 nordugrid:xrsl parsing error: 1:164: ')' expected
    # HTTP 500 Unable to read or parse job description (CE log: Empty job description source string)
    # HTTP 500 No job description parser was able to interpret job description (one job's entry)
    Pattern(
        "config",
        re.compile(
            r"xrsl parsing error|Unable to read or parse job description|"
            r"No job description parser was able"
        ),
        "the job description gridgate wrote is invalid (check backends.arc.xrsl)",
        exclude=False,
        transient=False,
        local=True,
    ),
    # connect: Connection refused / connect: cannot resolve ce.example.org: ...
    # receive: the server closed the connection without an answer
    Pattern(
        "unreachable",
        re.compile(r"^connect: |^receive: |^send: "),
        "nothing answers at the CE's address",
    ),
    # TLS: [SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:992)
    Pattern(
        "config",
        re.compile(r"^TLS: .*wrong version number"),
        "the CE's port does not speak TLS: not an ARC CE's address",
        transient=False,
    ),
    # TLS: certificate verify failed: self-signed certificate in certificate chain
    # TLS: certificate verify failed: IP address mismatch, certificate is not valid for '127.0.0.1'.
    Pattern(
        "config",
        re.compile(r"^TLS: certificate verify failed|^TLS: .*mismatch"),
        "this machine does not trust the CE's host certificate for this host name "
        "(X509_CERT_DIR, or the URL's host)",
        transient=False,
    ),
    # TLS: [SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca (the CE refused our proxy)
    Pattern(
        "auth",
        re.compile(r"^TLS: "),
        "the CE refused this machine's TLS credentials (the proxy's CA is not trusted there?)",
    ),
    # HTTP 403 User can't be assigned configuration
    Pattern(
        "auth",
        re.compile(r"^HTTP 40[13]\b"),
        "the CE refuses this credential (not in its authorisation groups)",
    ),
    # HTTP 404 Version Not Supported
    Pattern(
        "config",
        re.compile(r"Version Not Supported"),
        "the CE does not speak this REST version (interface: cli for an older ARC CE)",
        transient=False,
    ),
    Pattern(
        "config",
        re.compile(r"^HTTP 404\b"),
        "no A-REX REST interface at this URL (its path), or interface: cli",
        transient=False,
    ),
    # HTTP 501 Action not implemented
    Pattern(
        "config",
        re.compile(r"^HTTP 501\b"),
        "the CE does not implement this REST action (interface: cli for an older ARC CE)",
        transient=False,
    ),
    # HTTP 500 Requested queue nosuchqueue is not allowed for this user
    QUEUE,
    # HTTP 500 No more jobs allowed
    Pattern("busy", re.compile(r"No more jobs allowed"), "the CE takes no more jobs now"),
    Pattern("error", re.compile(r"^HTTP 5\d\d\b"), "the CE failed the request"),
    Pattern("bad_output", re.compile(r"^unreadable answer"), "the CE's answer cannot be read"),
    Pattern("error", re.compile(r"^too large: "), "the CE's answer passed the output cap"),
    # timeout: no complete answer within 60 s (cut during status line and headers)
    Pattern("timeout", re.compile(r"^timeout: "), "the CE did not answer before the deadline"),
    # anything else the CE or the connection said (never a deadline: that is ``timeout``)
    Pattern("error", re.compile(r"^(?!timeout: )\S"), "the REST call failed"),
)

REST_TABLE = PatternTable(REST_PATTERNS)
#: What the REST path finds wrong here before any call (the backend's own message).
LOCAL_TABLE = PatternTable(REST_PATTERNS[:2])


def match(command: CommandResult) -> tuple[Pattern, str] | None:
    """The first known pattern in what ``command`` printed, with the line that matched."""
    return TABLE.match_output(command)


def _said(command: CommandResult) -> str:
    """The most telling line of a failure nothing matched: an ERROR line, else the first."""
    lines = [ln.strip() for ln in f"{command.stderr}\n{command.stdout}".splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return (errors or lines or ["no output"])[0]


def classify(command: CommandResult | None, message: str = "") -> Failure:
    """What a failed ARC command means (``command`` None: nothing was run). A message of
    the backend's own (a poll that found the proxy expired) speaks before the output."""
    return TABLE.classify(
        command,
        message,
        search_message=True,
        bad_output=message or "exit 0 but no job id in the output",
        said=_said,
    )


def classify_rest(command: CommandResult | None, message: str = "") -> Failure:
    """What a failed REST call means (``command``: the exchange, see ``rest/client.py``;
    None: nothing was sent). A credential found unusable before any call (the backend's
    ``message``) speaks first; then the exchange's own lines decide; a call cut at its
    deadline is ``timeout``."""
    found = LOCAL_TABLE.match(message)
    if found is not None:
        return found[0].failure(found[1])
    if command is None:
        return KINDS["config"].failure(clip(message or "nothing was sent"), exclude=False)
    return REST_TABLE.classify(
        command,
        message,
        bad_output=message or "the CE's answer held no job id",
        said=_said_rest,
    )


def _said_rest(command: CommandResult) -> str:
    return command.stderr.strip() or "no answer"


def by_exchange(
    command: CommandResult | None,
    message: str,
    default: Callable[[CommandResult | None, str], Failure],
) -> Failure:
    """What a failure means by what it was: an HTTP exchange by the REST rules, a command by
    the client's, and one that made no call by ``default`` (its interface's rules)."""
    if command is None:
        return default(None, message)
    if command.argv[:1] in HTTP_METHODS:
        return classify_rest(command, message)
    return classify(command, message)


def vague(command: CommandResult) -> bool:
    """Whether a failed arcsub said only one of its :data:`VAGUE` lines: no pattern matched
    and nothing was killed, so a ``-d VERBOSE`` run would tell more."""
    if command.ok or command.timed_out or command.launch_error is not None:
        return False
    text = f"{command.stderr}\n{command.stdout}"
    return any(line in text for line in VAGUE) and match(command) is None


#: A proxy file larger than this is no proxy (it is a few KiB).
PROXY_BYTES = 1024 * 1024


def read_credential(path: str) -> bytes:
    """A proxy or bearer token file by core's rule for credentials
    (:func:`gridgate.core.files.read_credential`: owner and mode checked on the file opened, no
    link followed in a folder others may write), at most :data:`PROXY_BYTES`.

    :raises InputFileError: as :func:`gridgate.core.files.read_credential`."""
    return files.read_credential(path, max_bytes=PROXY_BYTES)


def proxy_problem(environ: Mapping[str, str], now: float) -> str:
    """Why the proxy the client would use is unusable, in the client's own words (``Proxy
    expired``, ``Cannot find any proxy``) so that it classifies as ``credential``; "" when it
    is valid or cannot be judged (no X509_USER_PROXY: the client looks elsewhere too)."""
    path = environ.get("X509_USER_PROXY") or f"/tmp/x509up_u{os.getuid()}"
    try:
        # the default /tmp/x509up_u<uid> is a name any user can create first: only a regular
        # file of this user that nobody else may read or write is taken (as arcproxy demands)
        data = read_credential(path)
    except InputFileError as exc:
        if exc.errno == errno.ENOENT:
            return (
                f"Cannot find any proxy: {path} does not exist"
                if environ.get("X509_USER_PROXY")
                else ""
            )
        return f"Cannot find any proxy: {exc}"
    try:
        from cryptography import x509

        ends = min(c.not_valid_after_utc.timestamp() for c in x509.load_pem_x509_certificates(data))
    except ValueError:
        return f"Cannot find any proxy: {path} holds no readable certificate"
    if ends <= now:
        return f"Proxy expired: {path} ended {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(ends))}"
    return ""
