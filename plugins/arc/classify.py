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
from dataclasses import dataclass

from gridgate.core.kinds import KINDS
from gridgate.core.model import CommandResult, Failure

_MAX_QUOTE = 200


@dataclass(frozen=True)
class Pattern:
    """A line the ARC client prints and what it means."""

    kind: str
    regex: re.Pattern[str]
    label: str
    exclude: bool = True
    notify: bool = True
    transient: bool = True
    local: bool = False


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


def clip(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= _MAX_QUOTE else line[: _MAX_QUOTE - 3] + "..."


def match(command: CommandResult) -> tuple[Pattern, str] | None:
    """The first known pattern in what ``command`` printed, with the line that matched."""
    return _match_text(f"{command.stderr}\n{command.stdout}")


def _match_text(text: str) -> tuple[Pattern, str] | None:
    for pattern in PATTERNS:
        for line in text.splitlines():
            if pattern.regex.search(line):
                return pattern, line.strip()
    return None


def _said(command: CommandResult) -> str:
    """The most telling line of a failure nothing matched: an ERROR line, else the first."""
    lines = [ln.strip() for ln in f"{command.stderr}\n{command.stdout}".splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return (errors or lines or ["no output"])[0]


def classify(command: CommandResult | None, message: str = "") -> Failure:
    """What a failed ARC command means (``command`` None: nothing was run)."""
    if command is None:  # nothing ran: no CE is to blame, the reason is ours
        return KINDS["config"].failure(clip(message or "nothing was run"), exclude=False)
    if command.launch_error is not None:
        return KINDS["launch"].failure(
            clip(f"could not start {command.argv[0]}: {command.launch_error}")
        )
    # a message of the backend's own (a poll that found the proxy expired) speaks first
    found = _match_text(message) or match(command)
    if found is not None:
        pattern, line = found
        return KINDS[pattern.kind].failure(
            clip(f"{pattern.label}: {line!r}"),
            exclude=pattern.exclude,
            notify=pattern.notify,
            transient=pattern.transient,
            local=pattern.local,
        )
    if command.timed_out:
        return KINDS["timeout"].failure(f"timed out after {command.duration:.1f} s and was killed")
    if command.returncode == 0:
        return KINDS["bad_output"].failure(clip(message or "exit 0 but no job id in the output"))
    return KINDS["error"].failure(clip(f"exit code {command.returncode}: {_said(command)!r}"))


def vague(command: CommandResult) -> bool:
    """Whether a failed arcsub said only one of its :data:`VAGUE` lines: no pattern matched
    and nothing was killed, so a ``-d VERBOSE`` run would tell more."""
    if command.ok or command.timed_out or command.launch_error is not None:
        return False
    text = f"{command.stderr}\n{command.stdout}"
    return any(line in text for line in VAGUE) and match(command) is None
