"""The `arc` backend's boundary: every document that comes from outside the process is decoded
here, by one function per kind, into typed values; every way one can be wrong is one
:class:`~gridgate.core.documents.DocumentError` (a ``ValueError``). Past these functions nothing
checks a shape again.

- A-REX's JSON answers (``shared/reference/arc.md``, REST interface, traps 3-5): the version
  list (:func:`rest_versions`), the job answers of creation, listing and management
  (:func:`job_answer`: one item is an object and several a list, an empty list an empty body,
  each job's ``status-code`` a string), the ``info`` document's activity in them, the id a
  delegation's ``Location`` names (:func:`delegation_id`) and a ranged answer's
  ``Content-Range`` total (:func:`content_range_total`), the CE's GLUE2 document
  (:func:`glue_shares`: its shares' queue state);
- the claims of a bearer token that say when it ends (:func:`token_end`) and whose it is
  (:func:`token_owner`);
- what the ARC client prints (:func:`submitted_ids`, :func:`arcstat_report`,
  :func:`killed_counts`, :func:`cleaned_counts`, :func:`not_in_list`);
- what this backend reads back from its own files and the state store: the stamp files
  (:func:`stamps`), a CE's REST marker (:func:`rest_marker`), a delegation's record
  (:func:`delegation_record`);
- what the private CE of the tests (:mod:`.ce`, :mod:`.issuer`) reads back: its set-up record
  (:func:`ce_record`), ARC's parsed ``arc.conf`` (:func:`arc_conf`), its issuer's record
  (:func:`issuer_record`).

Ids that the next step would refuse (a CE-side id that is no URL path element, a delegation id
that is not one either) are refused here, in the answer that carries them.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec

from gridgate.core.documents import DocumentError, ascii_int, decode_json
from gridgate.core.model import JobStatus
from gridgate.plugins.arc.parse import final_status

__all__ = [
    "jobname_in",
    "CE_ID",
    "JOB_ID_RE",
    "Activity",
    "DelegationRecord",
    "Entry",
    "GlueShare",
    "StatusReport",
    "CeRecord",
    "IssuerClient",
    "IssuerRecord",
    "arc_conf",
    "arccat_gone",
    "arcinfo_shares",
    "arcstat_report",
    "ce_record",
    "cleaned_counts",
    "content_range_total",
    "delegation_id",
    "delegation_record",
    "glue_shares",
    "job_answer",
    "issuer_clients",
    "issuer_record",
    "killed_counts",
    "not_in_list",
    "rest_marker",
    "rest_versions",
    "stamps",
    "submitted_ids",
    "token_end",
    "token_owner",
]

#: A CE-side job or delegation id: what A-REX returns, one path element of a URL.
CE_ID = r"^[A-Za-z0-9]{1,256}$"
#: A job id as arcsub prints it with ``-T arcrest`` (and as the REST path names its jobs):
#: the CE-side id is the last path element.
JOB_ID_RE = re.compile(r"^https://[^\s/]+(?:/[^\s/]+)*/[A-Za-z0-9]+\Z")
#: The largest file length a ``Content-Range`` may tell (8 EiB: what a signed 64-bit offset holds).
MAX_LENGTH = 2**63 - 1

CeId = Annotated[str, msgspec.Meta(pattern=CE_ID)]
#: ``status-code``: a string in A-REX 6.17's answers; a number is read too.
StatusCode = (
    Annotated[str, msgspec.Meta(pattern=r"^[1-5][0-9][0-9]$")]
    | Annotated[int, msgspec.Meta(ge=100, le=599)]
)


# --- A-REX's JSON ------------------------------------------------------------------------------


class _Versions(msgspec.Struct):
    version: str | list[str]


def rest_versions(body: bytes) -> tuple[str, ...]:
    """The REST versions ``GET /rest`` lists (``{"version":"1.0"}`` or a list of them)."""
    answer: _Versions = decode_json(body, _Versions, kind="A-REX version list")
    listed = answer.version
    return tuple(listed) if isinstance(listed, list) else (listed,)


class Activity(msgspec.Struct, frozen=True):
    """What a job's ``info`` document says of it (``ComputingActivity``): its name (the
    ``jobname``; "" while the info provider has not written it), its states
    (``arcrest:FINISHED``, ``nordugrid:...``), its exit code as written ("" when none) and the
    CE's error lines."""

    name: str = msgspec.field(default="", name="Name")
    state: str | list[str] = msgspec.field(default="", name="State")
    exit: str | int = msgspec.field(default="", name="ExitCode")
    error: str | list[str] = msgspec.field(default="", name="Error")

    @property
    def states(self) -> tuple[str, ...]:
        return _listed(self.state)

    @property
    def exit_code(self) -> str:
        return str(self.exit)

    @property
    def errors(self) -> tuple[str, ...]:
        return _listed(self.error)


class _InfoDocument(msgspec.Struct, frozen=True):
    ComputingActivity: Activity = msgspec.field(default_factory=Activity)


class Entry(msgspec.Struct, frozen=True):
    """One job's part of an answer: its ``status-code`` (:attr:`code`), ``reason``, CE-side
    ``id`` ("" when the CE gave none), ``state`` ("" when not told) and, in an ``info``
    answer, its :attr:`activity`."""

    status: StatusCode = msgspec.field(default="200", name="status-code")  # listings: ids only
    reason: str = ""
    id: CeId = ""
    state: str = ""
    #: a text, not a document, for a job younger than its info provider's first pass (seen on
    #: A-REX 6.17 right after a creation): read as no document
    info_document: _InfoDocument | str | None = None

    @property
    def code(self) -> int:
        return int(self.status)

    @property
    def activity(self) -> Activity | None:
        """The ``info`` document's activity; None when the entry has no ``info_document`` (or
        only its text)."""
        document = self.info_document
        return document.ComputingActivity if isinstance(document, _InfoDocument) else None


class _JobAnswer(msgspec.Struct):
    job: Entry | list[Entry]


def _listed(value: str | list[str]) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(value)
    return (value,) if value else ()


def job_answer(body: bytes) -> list[Entry]:
    """Every entry of a job answer (creation, ``GET jobs``, ``action=status|info|kill|clean``),
    in order, whatever its shape: an empty body is none, an object is one, a list is each."""
    if not body or body.isspace():
        return []
    answer: _JobAnswer = decode_json(body, _JobAnswer, kind="A-REX job answer")
    return answer.job if isinstance(answer.job, list) else [answer.job]


def delegation_id(location: str) -> str:
    """The id of a new delegation: the last ``/`` element of the raw ``Location`` header (A-REX
    6.17 answers ``/arex/rest/1.0/delegations?action=new/ID``, where a URL parser would put the
    id in the query: trap 2)."""
    identifier = location.rstrip("/").rsplit("/", 1)[-1]
    if not re.fullmatch(CE_ID, identifier):
        raise DocumentError("A-REX delegation Location", f"no delegation id in {location[:200]!r}")
    return identifier


def content_range_total(header: str) -> int:
    """The full length a ranged answer's ``Content-Range`` tells (``bytes 0-0/1234``)."""
    return ascii_int(header.rpartition("/")[2], kind="Content-Range total", maximum=MAX_LENGTH)


# --- bearer tokens -----------------------------------------------------------------------------


class _Claims(msgspec.Struct):
    exp: Annotated[float, msgspec.Meta(ge=0, le=1e12)] | None = None


class _Owner(msgspec.Struct):
    iss: str = ""
    sub: str = ""


def _claims_part(token: str) -> bytes:
    parts = token.split(".")
    if len(parts) < 2:
        raise DocumentError("bearer token", "no claims part (not a JWT)")
    payload = parts[1]
    try:
        return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    except (binascii.Error, ValueError):
        raise DocumentError("bearer token", "claims not base64url") from None


def token_end(token: str) -> float | None:
    """When a JWT bearer token ends (its ``exp`` claim, seconds), None when it names none.

    :raises DocumentError: not a JWT whose claims this machine can read (dot-separated parts,
        the second one base64url JSON), or an ``exp`` that is no time (a 400-digit number)."""
    return decode_json(_claims_part(token), _Claims, kind="bearer token claims").exp


def token_owner(token: str) -> str | None:
    """Whose a JWT bearer token is as A-REX names it, ``ISS/SUB`` (its ``iss`` and ``sub``
    claims, read without checking the signature: the CE checks it); None when it names no
    issuer or no subject.

    :raises DocumentError: not a JWT whose claims this machine can read, or an ``iss`` or
        ``sub`` that is no string."""
    owner: _Owner = decode_json(_claims_part(token), _Owner, kind="bearer token claims")
    return f"{owner.iss}/{owner.sub}" if owner.iss and owner.sub else None


# --- what this backend reads back ---------------------------------------------------------------


def stamps(text: str | bytes, valid: re.Pattern[str] | None = None) -> dict[str, float]:
    """A stamp file (name -> when it was first noted): the names ``valid`` matches, when given
    (a name that is not an id the next step takes is dropped)."""
    found: dict[str, float] = decode_json(text, dict[str, float], kind="stamp file")
    return {k: v for k, v in found.items() if valid is None or valid.match(k)}


class _Marker(msgspec.Struct):
    url: str
    queue: str = ""


def rest_marker(text: str | bytes) -> str:
    """The service URL a CE's REST marker (``rest.json``) recorded."""
    return decode_json(text, _Marker, kind="REST marker").url


class DelegationRecord(msgspec.Struct, frozen=True):
    """What the state store keeps of one delegation."""

    id: Annotated[str, msgspec.Meta(pattern=CE_ID)]
    service: str
    identity: str
    #: SHA-256 of the proxy certificate it was last signed with
    fingerprint: str
    #: when the delegated proxy ends (the proxy's end), clock seconds
    ends: float
    #: last time a director used it, clock seconds
    used: float
    #: when the proxy it was last signed with starts (0: recorded before this was kept)
    starts: float = 0.0
    #: the attributes of the credential it was made for (:attr:`.rest.signing.Proxy.attributes`)
    attributes: str = ""
    #: who made it on the CE when that is not the proxy itself: ``token ISS/SUB`` (a payload
    #: proxy delegated under ``auth: token``); '' : the proxy (``auth: x509``)
    owner: str = ""

    def dump(self) -> str:
        return msgspec.json.encode(self, order="sorted").decode()


def delegation_record(text: str | bytes) -> DelegationRecord:
    """A delegation's record as the state store holds it."""
    return decode_json(text, DelegationRecord, kind="delegation record")


# --- what the private CE reads back ------------------------------------------------------------


class CeRecord(msgspec.Struct, frozen=True):
    """What the private CE records of its set-up (``etc/ce.json``)."""

    port: Annotated[int, msgspec.Meta(ge=1, le=65535)]
    lrms: str
    info_period: int
    wakeup: int
    slurm_conf: str | None = None
    queues: list[str] = []
    #: a folder set up before tokens existed has none
    tokens: bool = False
    issuer_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] | None = None
    #: the audience its tokens must have: true (its own URL), a string, false (any)
    audience: bool | str = False


def ce_record(text: str | bytes) -> CeRecord:
    """The private CE's set-up record."""
    return decode_json(text, CeRecord, kind="private CE record")


def arc_conf(text: str | bytes) -> dict[str, dict[str, Any]]:
    """``arc.conf`` as ``arcconfig-parser --export json`` prints it: block -> option -> value
    (as ARC parsed it: the private CE reads the options it wrote itself)."""
    conf: dict[str, dict[str, Any]] = decode_json(
        text, dict[str, dict[str, Any]], kind="arcconfig-parser export"
    )
    return conf


class IssuerRecord(msgspec.Struct, frozen=True):
    """What the private token issuer records of itself (``issuer.json``)."""

    url: str
    kid: str


def issuer_record(text: str | bytes) -> IssuerRecord:
    """The private token issuer's record."""
    return decode_json(text, IssuerRecord, kind="token issuer record")


class IssuerClient(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A client registered with the private token issuer (``clients.json``): the salted
    SHA-256 of its secret (never the secret), the scopes and audiences it may ask for, and the
    lifetime of its tokens in seconds."""

    salt: str
    secret_sha256: str
    scopes: tuple[str, ...]
    audiences: tuple[str, ...]
    lifetime: Annotated[int, msgspec.Meta(gt=0)]


def issuer_clients(text: str | bytes) -> dict[str, IssuerClient]:
    """The private token issuer's registered clients, by client id."""
    return decode_json(text, dict[str, IssuerClient], kind="token issuer clients")


# --- what the ARC client prints -----------------------------------------------------------------

#: ``Job submitted with jobid: https://ce:443/arex/rest/1.0/jobs/ID`` (one line per job, input order)
SUBMITTED_RE = re.compile(r"^Job submitted with jobid:\s*(\S+)\s*$")
#: ``Status of 3 jobs was queried, 1 jobs returned information``
SUMMARY_RE = re.compile(
    r"Status of ([0-9]{1,9}) jobs? (?:was|were) queried, ([0-9]{1,9}) jobs? returned information"
)
#: ``WARNING: Failed to process job: ID - 404 Job not found`` (or no reason at all)
FAILED_JOB_RE = re.compile(r"^WARNING: Failed to process job: (\S+)(?: - (.*))?$")
#: ``Warning: Job not found in job list: ID`` (the client never asks the CE about such an id)
NOT_IN_LIST_RE = re.compile(r"^Warning: Job not found in job list: (\S+)\s*$")
#: ``Jobs processed: 2, successfully killed: 1, successfully cleaned: 0``
KILLED_RE = re.compile(r"Jobs processed: ([0-9]{1,9}), successfully killed: ([0-9]{1,9})")
#: ``Jobs processed: 1, deleted: 1``
CLEANED_RE = re.compile(r"Jobs processed: ([0-9]{1,9}), deleted: ([0-9]{1,9})")


def submitted_ids(stdout: str) -> list[str]:
    """The job ids arcsub printed, in input order (only those of a job id's form)."""
    ids = []
    for line in stdout.splitlines():
        found = SUBMITTED_RE.match(line.strip())
        if found and JOB_ID_RE.match(found.group(1)):
            ids.append(found.group(1))
    return ids


@dataclass(frozen=True)
class StatusReport:
    """What one arcstat call said.

    ``statuses`` per job id that had a block (its ``State``, ``Exit Code`` and ``Job Error``);
    ``gone`` the ids the CE answered 404 for (it no longer has them) or
    that are not in the job list (the client never asked); ``failed`` the ids the client could
    not get information about for another reason (CE down, proxy refused), with that reason;
    ``queried``/``returned`` the summary line's numbers (None when absent).
    """

    statuses: Mapping[str, JobStatus] = field(default_factory=dict)
    gone: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    queried: int | None = None
    returned: int | None = None


def arcstat_report(stdout: str, stderr: str = "") -> StatusReport:
    """Read arcstat's per-job blocks (``Job: ID`` then `` Key: value`` lines), its warnings and
    its summary line. Fields it does not know are ignored."""
    blocks: dict[str, dict[str, str]] = {}
    current: str | None = None
    for line in stdout.splitlines():
        if line.startswith("Job: "):
            current = line[5:].strip()
            blocks[current] = {}
        elif current is not None and line.startswith(" ") and ":" in line:
            key, _, value = line.strip().partition(":")
            blocks[current].setdefault(key.strip(), value.strip())
        elif not line.strip():
            current = None
    gone: list[str] = []
    failed: dict[str, str] = {}
    for line in f"{stdout}\n{stderr}".splitlines():
        line = line.strip()
        found = FAILED_JOB_RE.match(line)
        if found:
            job_id, why = found.group(1), (found.group(2) or "").strip()
            if why.startswith("404"):
                gone.append(job_id)
            else:
                failed[job_id] = why or "the CE returned no information"
            continue
        found = NOT_IN_LIST_RE.match(line)
        if found:
            gone.append(found.group(1))
    summary = SUMMARY_RE.search(stdout) or SUMMARY_RE.search(stderr)
    statuses = {
        job_id: final_status(
            job_id,
            fields.get("State") or "",
            fields.get("Exit Code") or "",
            fields.get("Job Error") or "",
        )
        for job_id, fields in blocks.items()
    }
    return StatusReport(
        statuses=statuses,
        gone=tuple(dict.fromkeys(gone)),
        failed=failed,
        queried=int(summary.group(1)) if summary else None,
        returned=int(summary.group(2)) if summary else None,
    )


def killed_counts(stdout: str) -> tuple[int, int] | None:
    """(processed, killed) from arckill's summary; None when it printed none ("No jobs")."""
    found = KILLED_RE.search(stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def cleaned_counts(stdout: str) -> tuple[int, int] | None:
    """(processed, deleted) from arcclean's summary; None when it printed none."""
    found = CLEANED_RE.search(stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def not_in_list(text: str) -> list[str]:
    """The ids the client says are not in its job list."""
    return [m.group(1) for m in (NOT_IN_LIST_RE.match(ln.strip()) for ln in text.splitlines()) if m]


_JOBNAME = re.compile(r"\(\s*jobname\s*=\s*\"([^\"]*)\"", re.IGNORECASE)
_QUOTED = re.compile(r"\"([^\"]*)\"")


def jobname_in(description: str, base: str) -> str:
    """The job name in a description A-REX keeps (``diagnose/description``: the xRSL as it
    parsed it): its ``jobname`` attribute, else the first quoted word that starts with
    ``base-`` (a description kept in another layout); "" when none."""
    named = _JOBNAME.search(description)
    if named:
        return named.group(1)
    for word in _QUOTED.findall(description):
        if word.startswith(base + "-"):
            return word
    return ""


# --- the CE's GLUE2 document (GET info) ----------------------------------------------------------

#: A GLUE2 count as A-REX 6.17's JSON writes it (a string of digits); a number is read too.
GlueCount = (
    Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,10}$")]
    | Annotated[int, msgspec.Meta(ge=0, le=10**10)]
)
#: GLUE2's ServingState_t, from the best to the worst for a new job.
SERVING_ORDER = ("production", "queueing", "draining", "closed")
GlueServing = Literal["production", "queueing", "draining", "closed"]
#: The REST interface's name among a CE's GLUE2 endpoints.
REST_INTERFACE = "org.nordugrid.arcrest"


class _GlueLinks(msgspec.Struct):
    ComputingShareID: str | list[str] = ""


class _GlueEndpoint(msgspec.Struct):
    InterfaceName: str = ""
    ServingState: GlueServing = "production"
    Associations: _GlueLinks | None = None


class _GlueShare(msgspec.Struct):
    ID: str = ""
    Name: str = ""
    MappingQueue: str = ""
    ServingState: GlueServing = "production"
    WaitingJobs: GlueCount | None = None
    PreLRMSWaitingJobs: GlueCount | None = None
    RunningJobs: GlueCount | None = None
    FreeSlots: GlueCount | None = None
    MaxWallTime: GlueCount | None = None
    MaxMainMemory: GlueCount | None = None
    MaxSlotsPerJob: GlueCount | None = None


class _GlueService(msgspec.Struct):
    ComputingEndpoint: _GlueEndpoint | list[_GlueEndpoint] = []
    ComputingShare: _GlueShare | list[_GlueShare] = []


class _GlueServices(msgspec.Struct):
    ComputingService: _GlueService


class _GlueDomain(msgspec.Struct):
    Services: _GlueServices


class _GlueDomains(msgspec.Struct):
    AdminDomain: _GlueDomain


class _GlueInfo(msgspec.Struct):
    Domains: _GlueDomains


@dataclass(frozen=True)
class GlueShare:
    """One ComputingShare of a CE's GLUE2 document: its name and queue, its serving state (the
    worse of the share's and of the REST endpoints that serve it: A-REX 6.17 always publishes a
    share in production, and a drain on its endpoints), and its figures (None: not published).
    ``waiting`` is WaitingJobs (every user's jobs in the batch system) plus PreLRMSWaitingJobs
    (jobs A-REX holds before passing them on)."""

    name: str
    queue: str
    serving: str
    waiting: int | None
    running: int | None
    free_slots: int | None
    max_walltime: int | None
    max_memory_mb: int | None
    max_slots: int | None


def _count(value: str | int | None) -> int | None:
    return None if value is None else int(value)


def _many(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def glue_shares(body: bytes) -> list[GlueShare]:
    """The shares of A-REX's GLUE2 document (``GET /rest/1.0/info`` as JSON; one share is an
    object, several a list).

    :raises DocumentError: a document that is not GLUE2 as A-REX writes it (a count that is
        not digits, a serving state GLUE2 does not name, no ComputingService)."""
    info: _GlueInfo = decode_json(body, _GlueInfo, kind="A-REX GLUE2 info")
    service = info.Domains.AdminDomain.Services.ComputingService
    # the REST endpoints' serving state, by the share they serve
    drained: dict[str, str] = {}
    for endpoint in _many(service.ComputingEndpoint):
        if endpoint.InterfaceName != REST_INTERFACE or endpoint.Associations is None:
            continue
        for share in _listed(endpoint.Associations.ComputingShareID):
            known = drained.get(share, "production")
            drained[share] = max(known, endpoint.ServingState, key=SERVING_ORDER.index)
    shares = []
    for share in _many(service.ComputingShare):
        waiting = _count(share.WaitingJobs)
        held = _count(share.PreLRMSWaitingJobs)
        shares.append(
            GlueShare(
                name=share.Name,
                queue=share.MappingQueue or share.Name,
                serving=max(
                    share.ServingState,
                    drained.get(share.ID, "production"),
                    key=SERVING_ORDER.index,
                ),
                waiting=None if waiting is None else waiting + (held or 0),
                running=_count(share.RunningJobs),
                free_slots=_count(share.FreeSlots),
                max_walltime=_count(share.MaxWallTime),
                max_memory_mb=_count(share.MaxMainMemory),
                max_slots=_count(share.MaxSlotsPerJob),
            )
        )
    return shares


# --- arcinfo -l ----------------------------------------------------------------------------------

#: What an arcinfo answer is called in its errors.
ARCINFO_KIND = "arcinfo -l output"
#: ``Max wall-time: 1 hour 30 minutes``: ARC's period words (6.17 prints hours at most)
_PERIOD_PART = re.compile(r"([0-9]{1,9}) (hours?|minutes?|seconds?)")
_PERIOD_UNIT = {"hour": 3600, "minute": 60, "second": 1}
_ARCINFO_COUNT = re.compile(r"[0-9]{1,9}")


def _period(text: str) -> int | None:
    """Seconds of ``1 hour 30 minutes`` (parts joined by a blank or ``, ``); None if not one."""
    parts = [p for p in re.split(r",? ", text) if p]
    if not parts or len(parts) % 2:
        return None
    total = 0
    for number, unit in zip(parts[::2], parts[1::2], strict=True):
        if not _PERIOD_PART.fullmatch(f"{number} {unit}"):
            return None
        total += int(number) * _PERIOD_UNIT[unit.rstrip("s")]
    return total


def arcinfo_shares(stdout: str) -> list[GlueShare]:
    """The shares ``arcinfo -l -c URL`` (ARC 6.17) printed, as :class:`GlueShare`.

    arcinfo prints of a share its ``Name:``, ``Mapping queue:``, ``Max wall-time:`` (a period:
    ``1 hour``) and ``Free slots:``; it prints no running or waiting job count (``Used slots:``
    counts slots, and is left out at 0), so those stay None. A share's serving state is the
    worst of the ``org.nordugrid.arcrest`` endpoints' ``Serving state:`` (arcinfo does not say
    which share an endpoint serves; A-REX publishes a drain on its endpoints). Other lines are
    ignored.

    :raises DocumentError: not arcinfo's output (no ``Computing service:`` first), or a line
        read here whose value arcinfo does not print (named with its line number).
    """
    lines = stdout.splitlines()
    if not lines or lines[0].strip() != "Computing service:":
        raise DocumentError(ARCINFO_KIND, "line 1: not 'Computing service:'")
    section = ""
    interface = ""
    serving = "production"
    shares: list[dict[str, Any]] = []
    for number, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        if line in ("Endpoint Information:", "Share Information:", "Batch System Information:"):
            section = line
            interface = ""
            if line == "Share Information:":
                shares.append({})
            continue
        key, colon, value = line.partition(": ")
        if not colon:
            continue
        where = f"line {number}: {key}"
        if section == "Endpoint Information:":
            if key == "Interface":
                interface = value
            elif key == "Serving state":
                if value not in SERVING_ORDER:
                    raise DocumentError(ARCINFO_KIND, f"{where}: {value[:80]!r} is not a state")
                if interface == REST_INTERFACE:
                    serving = max(serving, value, key=SERVING_ORDER.index)
        elif section == "Share Information:":
            share = shares[-1]
            if key in ("Name", "Mapping queue"):
                share[key] = value
            elif key == "Free slots":
                if not _ARCINFO_COUNT.fullmatch(value):
                    raise DocumentError(ARCINFO_KIND, f"{where}: {value[:80]!r} is not a count")
                share[key] = int(value)
            elif key == "Max wall-time":
                seconds = _period(value)
                if seconds is None:
                    raise DocumentError(ARCINFO_KIND, f"{where}: {value[:80]!r} is not a period")
                share[key] = seconds
    return [
        GlueShare(
            name=str(share.get("Name") or ""),
            queue=str(share.get("Mapping queue") or share.get("Name") or ""),
            serving=serving,
            waiting=None,
            running=None,
            free_slots=share.get("Free slots"),
            max_walltime=share.get("Max wall-time"),
            max_memory_mb=None,
            max_slots=None,
        )
        for share in shares
    ]


def arccat_gone(text: str) -> str:
    """Why arccat printed nothing of a job the CE (or the client's job list) no longer holds,
    from its output (``Warning: Job not found in job list: ID`` once gridgate cleaned it,
    ``WARNING: Failed to process job: ID - 404 Job not found`` once the CE dropped it); ""
    when it said neither."""
    for line in text.splitlines():
        line = line.strip()
        found = NOT_IN_LIST_RE.match(line)
        if found:
            return (
                f"the CE no longer holds job {found.group(1)} (cleaned off it: not in the job list)"
            )
        found = FAILED_JOB_RE.match(line)
        if found and (found.group(2) or "").startswith("404"):
            return f"the CE no longer holds job {found.group(1)}"
    return ""
