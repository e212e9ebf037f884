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

import re

from gridgate.core.model import CommandResult, Failure
from gridgate.core.patterns import Pattern, PatternTable, clip

__all__ = ["PATTERNS", "TABLE", "VAGUE", "classify", "clip", "match", "vague"]

#: Order matters: the first pattern found in the output decides (specific before general).
PATTERNS: tuple[Pattern, ...] = (
    # Proxy expired. Job submission aborted. Please run 'arcproxy'!
    # Cannot find any proxy. This application currently cannot run without a proxy.
    # WARNING: Certificate and key ('usercert.pem' and 'userkey.pem') not found in any of the paths
    # ERROR: Failed configuration initialization
    Pattern(
        "credential",
        re.compile(
            r"Proxy expired|Cannot find any proxy|Certificate and key \('usercert\.pem' and "
            r"'userkey\.pem'\) not found|Failed configuration initialization"
        ),
        "no usable proxy on this machine",
        exclude=False,
        transient=False,
        local=True,
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
    Pattern(
        "config",
        re.compile(r"does not match selected queue|Requested queue \S+ is not allowed"),
        "the CE does not offer this queue to this user",
        transient=False,
    ),
)

#: arcsub's ERROR lines for many causes (an untrusted CA, a DN the CE refuses, a queue it does
#: not offer, a wrong path): nothing was submitted, and only ``-d VERBOSE`` says why.
VAGUE = (
    "Job submission aborted because no resource returned any information",
    "One or multiple job descriptions was not submitted",
)


TABLE = PatternTable(PATTERNS)


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


def vague(command: CommandResult) -> bool:
    """Whether a failed arcsub said only one of its :data:`VAGUE` lines: no pattern matched
    and nothing was killed, so a ``-d VERBOSE`` run would tell more."""
    if command.ok or command.timed_out or command.launch_error is not None:
        return False
    text = f"{command.stderr}\n{command.stdout}"
    return any(line in text for line in VAGUE) and match(command) is None
