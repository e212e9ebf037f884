"""The `arc` backend's REST interface (``interface: rest``): submission, tracking, cancel, cleaning
and the stderr sample of failed pilots, over A-REX's REST interface.

What it does that arcsub cannot (``shared/reference/arc.md``, REST interface):

- **One delegation per CE and credential** (:mod:`.delegation`) named by every job, instead of
  a new one (a key made on the CE) per arcsub.
- **Bulk creation**: a request's ``pilots_per_submission`` descriptions go in one ``POST
  jobs?action=new`` (a multi-xRSL), then the pilot script is uploaded into each job's session.
  Every entry of the answer is read on its own (per-job status codes inside a 201); a
  whole-request 500 (one bad description fails a whole bundle) sends the descriptions one by
  one rather than blame the CE; an answer lost after the request was sent is **reconciled by
  job name** before anything else (each pilot's name is unique), so no pilot is created twice;
  a job whose upload failed is killed and cleaned (it would wait for its input for ever).
- **Bulk management**: one ``action=status`` POST per CE per poll (chunked only for very
  large fleets), then one ``action=info`` for the pilots that just finished or failed (their
  exit code and the CE's error), the stderr sample read from the session folder (two ranged
  GETs per failed pilot, for ``stderr_samples`` pilots), ``action=kill`` and
  ``action=clean`` in bulk; a pilot's output read from its session on demand
  (:mod:`.output`).

Every REST failure comes back as a failed result whose ``command`` is the exchange (see
:func:`.client.evidence`), classified by the REST rules of :mod:`gridgate.plugins.arc.classify`
into the kinds the CLI path uses. The site's output cap (``director.max_output_bytes``) caps
every answer, and the hook call's deadline every exchange.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from gridgate.core.backend import Deadline, found_pilots, job_name, submission_of
from gridgate.core.credential_names import in_force
from gridgate.core.documents import DocumentError
from gridgate.core.files import InputFileError, atomic_write, ensure_private_dir
from gridgate.core.http import HttpClient
from gridgate.core.kinds import missing_input
from gridgate.core.model import (
    TERMINAL_STATES,
    CancelResult,
    CommandResult,
    Failure,
    FoundPilots,
    JobStatus,
    OutputStream,
    PilotOutput,
    PilotState,
    StatusResult,
    SubmitRequest,
    SubmitResult,
)
from gridgate.core.patterns import clip
from gridgate.core.plugins import PluginContext
from gridgate.plugins.arc.ces import CE, CeLocks, CleanList, environment
from gridgate.plugins.arc.classify import (
    by_exchange,
    classify_rest,
    proxy_problem,
    read_credential,
    shared_folder,
)
from gridgate.plugins.arc.describe import Descriptions
from gridgate.plugins.arc.documents import jobname_in, rest_marker, token_end, token_owner
from gridgate.plugins.arc.parse import STDERR, with_stderr
from gridgate.plugins.arc.rest.client import ArexClient, ArexError, failed
from gridgate.plugins.arc.rest.delegation import Delegations
from gridgate.plugins.arc.rest.jobs import (
    FINAL_NATIVE,
    bundle,
    ce_id,
    info_status,
    job_url,
    pilot_state,
)
from gridgate.plugins.arc.rest.output import session_output
from gridgate.plugins.arc.rest.payload import Payload, PayloadSource
from gridgate.plugins.arc.rest.signing import Proxy, ProxyError, read_proxy
from gridgate.plugins.arc.settings import ArcSettings

__all__ = ["SCRIPT_WHAT", "Credential", "RestInterface", "find_token"]

OPERATION_SUBMIT = "Job Submit"
#: How the pilot script is named when it is missing (the failure is ``missing_input``).
SCRIPT_WHAT = "the pilot script (backends.arc.script)"
#: Looks for the jobs of a bundle whose creation answer was lost, and the pause before each
#: further one: A-REX creates a bundle's jobs one after the other, and an answer lost as the
#: connection broke can come before the last of them exists (seen on the private CE: 2 of 3
#: found 60 ms after the loss, the third a moment later).
LOST_LOOKS = (0.0, 0.3, 1.0, 2.0)
DEFAULT_CA_PATH = "/etc/grid-security/certificates"


#: Uploads of one bundle's pilot scripts that run at a time (each on a kept-alive connection).
UPLOADS = 4
#: States of a job just created and still waiting for its uploaded input.
WAITING_INPUT = frozenset({"ACCEPTING", "ACCEPTED"})


@dataclass(frozen=True)
class Credential:
    """What a REST call of this backend authenticates with: the proxy (``x509``: the client
    certificate, and what delegations are signed with) or a bearer token (``token``: an
    ``Authorization`` header, no client certificate, no delegation). ``problem`` says why it
    cannot be used, in words the classifier reads as ``credential``."""

    kind: str
    ca_path: str
    cert_file: str | None = None
    proxy: Proxy | None = None
    token: str = ""
    problem: str = ""

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def owner(self) -> str:
        """Who a delegation made with this credential belongs to on the CE, when not the proxy
        itself: for a token, ``token ISS/SUB`` as A-REX names its owner (the claims read, not
        checked: the CE checks them), else the named credential's name; '' for a proxy."""
        if self.kind != "token":
            return ""
        try:
            found = token_owner(self.token)
        except DocumentError:
            found = None
        if found is None:  # not a JWT naming its issuer and subject: the credential's name
            found = f"credential {in_force().get('token') or 'token'}"
        return f"token {found}"


def find_token(managed: Mapping[str, str], environ: Mapping[str, str]) -> tuple[str, str]:
    """(token, where it came from) for ``auth: token``; ("", what was looked at) when none.

    The managed credential's ``BEARER_TOKEN_FILE`` (``credentials.bearer_token``) first; else
    the WLCG Bearer Token Discovery order: ``BEARER_TOKEN``, ``BEARER_TOKEN_FILE``,
    ``$XDG_RUNTIME_DIR/bt_u$UID``, ``/tmp/bt_u$UID``."""
    uid = os.getuid()
    if managed.get("BEARER_TOKEN_FILE"):
        candidates = [("file", managed["BEARER_TOKEN_FILE"])]
    else:
        candidates = []
        if environ.get("BEARER_TOKEN", "").strip():  # not config: the environment
            return environ["BEARER_TOKEN"].strip(), "BEARER_TOKEN"
        if environ.get("BEARER_TOKEN_FILE"):
            candidates.append(("file", environ["BEARER_TOKEN_FILE"]))
        if environ.get("XDG_RUNTIME_DIR"):
            candidates.append(("file", f"{environ['XDG_RUNTIME_DIR']}/bt_u{uid}"))
        candidates.append(("file", f"/tmp/bt_u{uid}"))
    refused: list[str] = []
    for _kind, path in candidates:
        try:
            data = read_credential(path)
        except InputFileError as exc:
            if exc.errno != errno.ENOENT:
                refused.append(str(exc))  # a token others can read or replace is not sent
            continue
        token = data.decode("utf-8", "replace").strip()
        if token:
            return token, path
    where = ", ".join(path for _kind, path in candidates)
    return "", where + (f" (refused: {'; '.join(refused)})" if refused else "")


def _state_of(native: str) -> PilotState:
    """Core's state of a job found by name (its exit code is not read here: a finished one is
    ``done`` until the status poll reads how it ended)."""
    state: PilotState = pilot_state(native, None)  # type: ignore[assignment]
    return state


def token_expired(token: str, now: float) -> float | None:
    """The end of a JWT bearer token when it has passed (its ``exp`` claim), else None (valid,
    or not a JWT this machine can read: then the CE judges it)."""
    try:
        ends = token_end(token)
    except DocumentError:
        return None
    return ends if ends is not None and ends <= now else None


class RestInterface:
    """A-REX's REST interface as the way to the CEs (one per backend instance).

    :param settings: the section.
    :param context: the plugin context (state store, clock, output cap, credentials).
    :param descriptions: writes the pilots' xRSL and finds the pilot script.
    :param finals: the pilots to clean, where final pilots are noted.
    :param locks: the CEs' file locks (the pilots to look for).
    """

    def __init__(
        self,
        settings: ArcSettings,
        context: PluginContext,
        descriptions: Descriptions,
        finals: CleanList,
        locks: CeLocks,
    ) -> None:
        self.settings = settings
        self.context = context
        self.descriptions = descriptions
        self.finals = finals
        self.locks = locks
        self.delegations = Delegations(context.state, context.clock)
        #: ``auth: token``: the payload proxy's delegations, made under the token (each owned
        #: by the token's identity: :meth:`Credential.owner`)
        self.payload_delegations = Delegations(context.state, context.clock)
        self.payload = PayloadSource(
            settings.payload_credential, context, lambda path: self._read_proxy(path)[0]
        )
        self._lock = threading.Lock()
        self._http: dict[tuple[str, str | None, tuple[tuple[str, str], ...]], HttpClient] = {}
        self._clients: dict[
            tuple[str, str, str | None, tuple[tuple[str, str], ...]], ArexClient
        ] = {}
        self._proxies: dict[str, tuple[tuple[int, int, int], Proxy, str]] = {}

    def classify(self, command: CommandResult | None, message: str) -> Failure:
        return by_exchange(command, message, classify_rest)

    def services(self, ces: Sequence[CE]) -> list[str]:
        return [ce.endpoint.url.rstrip("/") for ce in ces]

    def close(self) -> None:
        """Close every kept-alive connection."""
        with self._lock:
            clients, self._http = list(self._http.values()), {}
            self._clients = {}
        for http in clients:
            http.close()

    # --- credentials and clients -----------------------------------------------------------

    def credential(self) -> Credential:
        """The credential every call of this hook call uses, read now (a renewed proxy or
        token is used at once)."""
        environ = environment(self.settings, self.context)
        ca_path = environ.get("X509_CERT_DIR") or DEFAULT_CA_PATH
        now = self.context.clock.time()
        if self.settings.auth == "token":
            token, where = find_token(self.context.credential_env("token"), environ)
            if not token:
                return Credential("token", ca_path, problem=f"no bearer token: none in {where}")
            ends = token_expired(token, now)
            if ends is not None:
                return Credential(
                    "token",
                    ca_path,
                    problem=f"Token expired: the bearer token from {where} ended at {_utc(ends)}",
                )
            return Credential("token", ca_path, token=token)
        path = environ.get("X509_USER_PROXY") or f"/tmp/x509up_u{os.getuid()}"
        problem = proxy_problem({**environ, "X509_USER_PROXY": path}, now)
        if problem:
            return Credential("x509", ca_path, cert_file=path, problem=problem)
        try:
            proxy, cert = self._read_proxy(path)
        except OSError as exc:
            return Credential(
                "x509", ca_path, cert_file=path, problem=f"Cannot find any proxy: {path}: {exc}"
            )
        except ProxyError as exc:
            return Credential(
                "x509", ca_path, cert_file=path, problem=f"Cannot find any proxy: {path} {exc}"
            )
        return Credential("x509", ca_path, cert_file=cert, proxy=proxy)

    def _read_proxy(self, path: str) -> tuple[Proxy, str]:
        """The proxy in ``path``, parsed again only when the file changed (loading its RSA key
        costs some 50 ms of CPU: once per renewal, not once per submission), and the file the
        TLS client is to load it from: ``path`` itself, or, for a path in a folder others may
        write (``/tmp/x509up_u<uid>``), a private copy of the bytes checked here, so that a
        link put there between the check and the TLS client's own open is never loaded."""
        shared = shared_folder(path)
        info = os.lstat(path) if shared else os.stat(path)
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        with self._lock:
            cached = self._proxies.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1], cached[2]
        data = read_credential(path)
        proxy = read_proxy(data)
        cert = path
        if shared:
            name = hashlib.sha256(path.encode()).hexdigest()[:16]
            copy = Path(self.context.state_dir) / "arc" / "credentials" / f"proxy-{name}.pem"
            ensure_private_dir(copy.parent)
            atomic_write(copy, data, durable=False)
            cert = str(copy)
        with self._lock:
            self._proxies[path] = (stamp, proxy, cert)
        return proxy, cert

    def client(self, service: str, credential: Credential) -> ArexClient:
        """The REST client of ``service`` with ``credential`` (kept: its connections stay open
        and its version is asked once)."""
        cert = credential.cert_file if credential.kind == "x509" else None
        # one client per named credential in force: a client's headers (the token) are set
        # per call, so two groups' tokens on one CE must not share one client. Nor one
        # connection: A-REX 6.17 takes every request of a kept-alive connection for the
        # identity of its first (seen on the private CE: a second VO's token asking on the
        # first's connection was answered as the first, and its jobs looked gone)
        named = tuple(sorted(in_force().items()))
        with self._lock:
            http = self._http.get((credential.ca_path, cert, named))
            if http is None:
                http = self._http[(credential.ca_path, cert, named)] = HttpClient(
                    ca_path=credential.ca_path,
                    cert_file=cert,
                    max_bytes=self.context.max_output_bytes,
                )
            key = (service.rstrip("/"), credential.ca_path, cert, named)
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = ArexClient(
                    service, http, max_bytes=self.context.max_output_bytes
                )
        client.headers = credential.headers
        return client

    @staticmethod
    def service(ce: CE, job_ids: Sequence[str] = ()) -> str:
        """The CE's service URL: its configured URL; for a CE no longer configured, the one
        its REST marker recorded, else its pilots' ids name."""
        if ce.endpoint.url:
            return ce.endpoint.url.rstrip("/")
        try:
            return rest_marker(ce.rest_marker.read_bytes()).rstrip("/")
        except (OSError, DocumentError):
            pass
        for job_id in job_ids:
            if "/rest/" in job_id:
                return job_id.split("/rest/", 1)[0]
        return ""

    def mark(self, ce: CE) -> str:
        """Make the CE's folder and record its URL there (so that its pilots can still be
        followed once it leaves the config); the OS error when it cannot."""
        marker = ce.rest_marker
        try:
            if not marker.exists():
                ensure_private_dir(ce.folder)
                data = {"url": ce.endpoint.url, "queue": ce.queue}
                atomic_write(marker, json.dumps(data).encode(), durable=False)
        except OSError as exc:
            return f"cannot prepare {ce.folder}: {exc}"
        return ""

    # --- submission ------------------------------------------------------------------------

    def submit(self, ce: CE, request: SubmitRequest, timeout: float) -> SubmitResult:
        endpoint = ce.endpoint
        problem = self.mark(ce)
        script = self.descriptions.script_path()
        missing = missing_input({SCRIPT_WHAT: script})
        if problem or missing:
            why = problem or missing
            return SubmitResult(
                endpoint, ok=False, operation=OPERATION_SUBMIT, local_fault=why, message=why
            )
        try:
            data = script.read_bytes()
        except OSError as exc:
            why = f"{SCRIPT_WHAT} {script} cannot be read: {exc.strerror}"
            return SubmitResult(
                endpoint, ok=False, operation=OPERATION_SUBMIT, local_fault=why, message=why
            )
        credential = self.credential()
        payload = self.payload.read()
        problem = credential.problem or (payload.problem if payload is not None else "")
        if problem:
            return SubmitResult(endpoint, ok=False, operation=OPERATION_SUBMIT, message=problem)
        deadline = self.settings.deadline(timeout)
        client = self.client(self.service(ce), credential)
        try:
            delegation = self.delegation(client, credential, payload, deadline)
        except ArexError as exc:
            return SubmitResult(
                endpoint,
                ok=False,
                command=exc.command,
                operation=OPERATION_SUBMIT,
                message=str(exc),
            )
        base = self.settings.job_name
        names = (
            [job_name(base, request, i) for i in range(request.count)]
            if request.name
            else [f"{base}-{uuid.uuid4().hex[:16]}" for _ in range(request.count)]
        )
        files = {script.name: data, **(payload.files() if payload is not None else {})}
        environment = payload.environment() if payload is not None else []
        descriptions = {
            n: self.descriptions.description(
                ce,
                request,
                name=n,
                delegation=delegation,
                uploads=[f for f in files if f != script.name],
                environment=environment,
            )
            for n in names
        }
        created, failures, command = self.create(ce, client, descriptions, delegation, deadline)
        uploaded, upload_failures = self._upload(ce, client, created, files, deadline)
        failures += upload_failures
        broken = [created[n] for n in created if n not in uploaded]
        # jobs without their script are killed and cleaned; when the CE went away and cannot
        # be reached to kill them, they are kept (uncertain), found by name when it answers
        # again and given their script then
        kept = bool(broken) and not self.discard(ce, client, broken, deadline)
        version = client.version or "1.0"
        ids = tuple(job_url(client.service, version, created[n]) for n in names if n in uploaded)
        # an answer lost with names still not found: core looks for them by name later
        uncertain = kept or any(f.lost and not f.entry for f in failures)
        if ids:
            if failures:
                logger.warning(
                    "{}: {} of {} pilots created; the others: {}",
                    endpoint.key,
                    len(ids),
                    request.count,
                    clip(str(failures[0])),
                )
            return SubmitResult(
                endpoint,
                ok=True,
                job_ids=ids,
                command=command,
                operation=OPERATION_SUBMIT,
                uncertain=uncertain,
            )
        first = failures[0] if failures else ArexError("nothing created", _no_command())
        return SubmitResult(
            endpoint,
            ok=False,
            command=first.command,
            operation=OPERATION_SUBMIT,
            message=str(first),
            uncertain=uncertain,
        )

    def delegation(
        self,
        client: ArexClient,
        credential: Credential,
        payload: Payload | None,
        deadline: Deadline,
    ) -> str:
        """The delegation the pilots name: of the proxy the CE is reached with (``auth:
        x509``), else of the payload's proxy, made under the token; '' for none.

        :raises ArexError: when the CE refuses or fails."""
        if credential.proxy is not None:
            return self.delegations.ensure(client, credential.proxy, deadline)
        if payload is not None and payload.proxy is not None:
            return self.payload_delegations.ensure(
                client, payload.proxy, deadline, credential.owner()
            )
        return ""

    def create(
        self,
        ce: CE,
        client: ArexClient,
        descriptions: Mapping[str, str],
        delegation: str,
        deadline: Deadline,
    ) -> tuple[dict[str, str], list[ArexError], CommandResult | None]:
        """Create the jobs of ``descriptions`` (name -> xRSL): name -> CE id of those created,
        why the others were not, and the (last) creation exchange."""
        names = list(descriptions)
        try:
            answer, command = client.create_jobs(
                bundle([descriptions[n] for n in names]),
                deadline,
                delegation=delegation,
                queue=ce.queue,
            )
        except ArexError as exc:
            if exc.status == 500 and len(names) > 1 and not deadline.passed():
                # one unparsable description fails a whole multi-xRSL (nothing created): each
                # on its own, so that the bad one is told apart and the CE is not blamed
                logger.info(
                    "{}: the CE refused the bundle of {} ({}); sending them one by one",
                    ce.endpoint.key,
                    len(names),
                    clip(str(exc)),
                )
                created: dict[str, str] = {}
                failures: list[ArexError] = []
                last: CommandResult | None = exc.command
                for name in names:
                    one, why, last = self.create(
                        ce, client, {name: descriptions[name]}, delegation, deadline
                    )
                    created.update(one)
                    failures += why
                    if why and not why[-1].entry and why[-1].status != 500:
                        break  # not this description's fault: the CE itself fails now
                return created, failures, last
            if exc.lost:
                return (*self._lost(ce, client, names, exc, deadline), exc.command)
            return {}, [exc], exc.command
        created = {}
        failures = []
        if len(answer) != len(names):
            logger.error(
                "{}: {} answer entries for {} descriptions; reconciling by name",
                ce.endpoint.key,
                len(answer),
                len(names),
            )
            lost = ArexError(f"{len(answer)} answer entries for {len(names)} jobs", command)
            return (*self._lost(ce, client, names, lost, deadline), command)
        for name, entry in zip(names, answer, strict=True):
            if entry.code == 201 and entry.id:
                created[name] = entry.id
            else:
                line = f"HTTP {entry.code} {entry.reason}".strip()
                failures.append(
                    ArexError(
                        f"{command.argv[0]} {command.argv[1]}: job {name}: {line}",
                        failed(command, line),
                        entry=True,
                    )
                )
        return created, failures, command

    def _lost(
        self,
        ce: CE,
        client: ArexClient,
        names: Sequence[str],
        exc: ArexError,
        deadline: Deadline,
    ) -> tuple[dict[str, str], list[ArexError]]:
        """The creation answer was lost after the request may have reached the CE: which of
        ``names`` exist there (in any state) is asked before anything is sent again.

        A bundle may still be being created when its answer is lost: the CE is asked again
        after a pause (:data:`LOST_LOOKS`, within the deadline) while some names are missing.
        The names still missing, or all of them when the CE cannot be asked now, are left to
        core: the submission's result is ``uncertain`` (``exc``, lost, among the failures), its
        intent stays, and ``gridgate_find_pilots`` looks for them at the next iterations."""
        found: dict[str, str] | None = {}
        for pause in LOST_LOOKS:
            if pause and deadline.left() <= pause + 1.0:
                break
            self.context.clock.sleep(pause)
            found = self.find_by_name(client, set(names), deadline)
            if found is None or len(found) == len(names):
                break
        if found is None:
            logger.error(
                "{}: the answer to creating {} pilot(s) was lost ({}) and the CE cannot be "
                "asked which exist now; they are looked for by name at the next iterations",
                ce.endpoint.key,
                len(names),
                clip(str(exc)),
            )
            return {}, [exc]
        missing = [n for n in names if n not in found]
        logger.warning(
            "{}: the answer to creating {} pilot(s) was lost ({}); {} found on the CE by name{}",
            ce.endpoint.key,
            len(names),
            clip(str(exc)),
            len(found),
            f", {len(missing)} looked for again at the next iterations" if missing else "",
        )
        return found, ([exc] if missing else [])

    def find_by_name(
        self, client: ArexClient, names: set[str], deadline: Deadline
    ) -> dict[str, str] | None:
        """name -> CE id of the jobs among ``names`` that the CE has, in any state; None when
        the CE cannot tell."""
        jobs = self.listing(client, deadline, names.__contains__)
        if jobs is None:
            return None
        return {name: identifier for identifier, (name, _state) in jobs.items()}

    def listing(
        self, client: ArexClient, deadline: Deadline, wanted: Callable[[str], bool]
    ) -> dict[str, tuple[str, str]] | None:
        """CE id -> (name, A-REX state) of every job of this credential on the CE whose name
        ``wanted`` takes, in **every** state (just accepted, preparing, queuing, running,
        finished...): one list, one bulk status, one bulk info; None when the CE cannot tell.

        A job's name is in its ``info`` document once the info provider has written it; for a
        job younger than that the document has none, and the description A-REX keeps is read
        instead (seen on the private CE: one of three jobs created together had no name yet)."""
        try:
            ids = client.list_jobs(deadline)
            if not ids:
                return {}
            states, _ = client.manage("status", ids, deadline)
            state = {e.id: e.state.upper() for e in states if e.code == 200 and e.id}
            # a listed job whose state the CE would not give (gone since the list: 404) may
            # be one looked for: a partial answer would leave it untracked, so ask again later
            unknown = {e.id for e in states if e.code not in (200, 404)}
            if unknown:
                logger.info(
                    "{}: {} listed job(s) without a state; looked for again later",
                    client.service,
                    len(unknown),
                )
                return None
            live = [i for i in ids if state.get(i, "") not in ("", "DELETED")]
            if not live:
                return {}
            info, _ = client.manage("info", live, deadline)
        except ArexError as exc:
            logger.info("{}: cannot look for jobs by name: {}", client.service, exc)
            return None
        found: dict[str, tuple[str, str]] = {}
        unnamed: list[str] = []
        for entry in info:
            name = entry.activity.name if entry.activity is not None else ""
            if name and wanted(name):
                found[entry.id] = (name, state.get(entry.id, ""))
            elif not name and entry.id:
                unnamed.append(entry.id)
        for identifier in unnamed:
            try:
                kept = client.description(identifier, deadline).decode("utf-8", "replace")
            except ArexError as exc:
                if exc.status == 404:  # cleaned since the list (A-REX writes it at creation)
                    logger.debug("{}: {} gone since the list", client.service, identifier)
                    continue
                logger.info(
                    "{}: cannot read the description of {}: {}", client.service, identifier, exc
                )
                return None
            name = jobname_in(kept, self.settings.job_name)
            if name and wanted(name):
                found[identifier] = (name, state.get(identifier, ""))
        return found

    def find_pilots(self, ce: CE, names: Sequence[str], fleet: str, timeout: float) -> FoundPilots:
        """The jobs of the submissions ``names`` (or of every submission of ``fleet``) on
        ``ce``, in every state (``gridgate_find_pilots``). A job found still waiting for its
        pilot script (its director stopped between the creation and the upload) is given it
        now, and is a pilot like any other; one that cannot be given it is killed and cleaned
        (it would wait for its input for ever) and left out."""
        endpoint = ce.endpoint
        credential = self.credential()
        if credential.problem:
            return FoundPilots(endpoint, ok=False, message=credential.problem)
        deadline = self.settings.deadline(timeout)
        client = self.client(self.service(ce), credential)
        base = self.settings.job_name
        wanted_names = set(names)

        def wanted(name: str) -> bool:
            submission = submission_of(name, base)
            return submission is not None and (
                submission in wanted_names or bool(fleet and submission.startswith(fleet + "-"))
            )

        jobs = self.listing(client, deadline, wanted)
        if jobs is None:
            return FoundPilots(endpoint, ok=False, message="the CE cannot be asked now")
        # only a submission that was never settled may lack its script (a pilot of the
        # registry got it before it was recorded): a fleet search never uploads
        waiting = [
            i
            for i, (name, st) in jobs.items()
            if st in WAITING_INPUT | {"PREPARING"} and submission_of(name, base) in wanted_names
        ]
        if waiting:
            script = self.descriptions.script_path()
            try:
                data = script.read_bytes()
            except OSError as exc:
                return FoundPilots(endpoint, ok=False, message=f"{SCRIPT_WHAT}: {exc}")
            payload = self.payload.read()
            files = {script.name: data, **(payload.files() if payload is not None else {})}
            if payload is not None and payload.problem:
                # without its payload credential a job gets nothing: it waits, then is discarded
                logger.warning("{}: {}", endpoint.key, payload.problem)
                files = {}
            done, _why = (
                self._upload(ce, client, {i: i for i in waiting}, files, deadline)
                if files
                else (set(), [])
            )
            if done:
                logger.warning(
                    "{}: {} job(s) of unsettled submissions given their pilot script",
                    endpoint.key,
                    len(done),
                )
            # one still waiting for its input that cannot be given it would wait for ever
            broken = [i for i in set(waiting) - done if jobs[i][1] in WAITING_INPUT]
            if broken:
                if not self.discard(ce, client, broken, deadline):
                    return FoundPilots(endpoint, ok=False, message="the CE cannot be reached now")
                for identifier in broken:
                    jobs.pop(identifier)
        version = client.version or "1.0"
        listed = [
            (name, JobStatus(job_url(client.service, version, i), _state_of(st), native=st))
            for i, (name, st) in jobs.items()
        ]
        return found_pilots(endpoint, base, names, fleet, listed)

    def _upload(
        self,
        ce: CE,
        client: ArexClient,
        created: Mapping[str, str],
        files: Mapping[str, bytes],
        deadline: Deadline,
    ) -> tuple[set[str], list[ArexError]]:
        """Put ``files`` (name -> bytes: the pilot script, the payload's token) into each
        created job's session, :data:`UPLOADS` jobs at a time (a bundle's uploads are most of
        its time); the names given all of them, and why the others failed (the caller discards
        those jobs: they would wait for ever). A-REX makes each uploaded file 0600, owned by
        the job's local user, in a session folder of mode 0700."""

        def one(item: tuple[str, str]) -> ArexError | None:
            try:
                for filename, data in files.items():
                    client.put_file(item[1], filename, data, deadline)
            except ArexError as exc:
                return exc
            return None

        items = list(created.items())
        if len(items) > 1:
            with ThreadPoolExecutor(max_workers=min(UPLOADS, len(items))) as pool:
                outcomes = list(pool.map(one, items))
        else:
            outcomes = [one(item) for item in items]
        done = {name for (name, _i), why in zip(items, outcomes, strict=True) if why is None}
        failures = [why for why in outcomes if why is not None]
        return done, failures

    def discard(
        self, ce: CE, client: ArexClient, identifiers: Sequence[str], deadline: Deadline
    ) -> bool:
        """Kill and clean jobs that must not run (their input never came). They are also
        noted for the cleaning pass of finished pilots, which asks again until the CE says
        they are gone: a clean sent while the kill is still under way is not always done.

        False, and nothing noted, when the CE cannot be reached for the kill (it went away):
        the caller leaves the jobs to be found by name when it answers again, rather than to a
        cleaning pass that would leave them waiting, untracked, until it got through."""
        version = client.version or "1.0"
        try:
            client.manage("kill", identifiers, deadline)
        except ArexError as exc:
            if _unreached(exc):
                logger.warning(
                    "{}: {} job(s) without their pilot script kept: the CE cannot be reached "
                    "to kill them ({}); looked for by name when it answers",
                    ce.endpoint.key,
                    len(identifiers),
                    clip(str(exc)),
                )
                return False
            self.finals.note(ce, [job_url(client.service, version, i) for i in identifiers])
            logger.error(
                "{}: {} job(s) without their pilot script not killed yet ({}); cleaned later",
                ce.endpoint.key,
                len(identifiers),
                clip(str(exc)),
            )
            return True
        self.finals.note(ce, [job_url(client.service, version, i) for i in identifiers])
        try:
            client.manage("clean", identifiers, deadline)
            how = "killed and cleaned"
        except ArexError:
            how = "killed (cleaned once the CE has ended them)"
        logger.warning(
            "{}: {} {} job(s) whose pilot script could not be uploaded",
            ce.endpoint.key,
            how,
            len(identifiers),
        )
        return True

    # --- tracking ---------------------------------------------------------------------------

    def job_status(self, ce: CE, ids: Sequence[str], timeout: float) -> StatusResult:
        endpoint = ce.endpoint
        credential = self.credential()
        if credential.problem:
            return StatusResult(endpoint, ok=False, commands=0, message=credential.problem)
        deadline = self.settings.deadline(timeout)
        service = self.service(ce, ids)
        client = self.client(service, credential)
        if credential.proxy is not None:
            self.delegations.refresh(client, credential.proxy, deadline)
            self.delegations.touch(client.service, credential.proxy.identity)
        else:
            self._refresh_payload(client, credential.owner(), deadline)
        by_ce = {ce_id(i): i for i in ids}
        try:
            answer, exchanges = client.manage("status", list(by_ce), deadline)
        except ArexError as exc:
            message = (
                "the CE's status answer passed director.max_output_bytes"
                if exc.command.stdout_truncated
                else str(exc)
            )
            return StatusResult(endpoint, ok=False, command=exc.command, message=message)
        statuses: dict[str, JobStatus] = {}
        final: dict[str, str] = {}
        for entry, identifier in zip(answer, by_ce, strict=True):
            job_id = by_ce[identifier]
            if entry.code == 404:
                continue  # the CE no longer has it: core marks it unknown, then lost
            native = entry.state
            if entry.code != 200:
                statuses[job_id] = JobStatus(
                    job_id=job_id, state="unknown", reason=clip(f"{entry.code} {entry.reason}")
                )
            elif native.upper() in FINAL_NATIVE:
                final[identifier] = native
            else:
                statuses[job_id] = JobStatus(
                    job_id=job_id,
                    state=pilot_state(native, None),  # type: ignore[arg-type]
                    native=native,
                )
        statuses.update(self._finals(client, final, by_ce, deadline))
        self._sample_stderr(client, statuses, deadline)
        self.finals.note(ce, [k for k, v in statuses.items() if v.state in TERMINAL_STATES])
        return StatusResult(
            endpoint, ok=True, statuses=statuses, command=exchanges[-1], commands=len(exchanges)
        )

    def _refresh_payload(self, client: ArexClient, owner: str, deadline: Deadline) -> None:
        """A poll's part under ``auth: token``: the payload proxy's delegation (of ``owner``,
        the token's identity) renewed when the proxy was (running pilots get it, as with
        ``auth: x509``), and marked used."""
        payload = self.payload.read()
        if payload is None or payload.proxy is None:
            return
        self.payload_delegations.refresh(client, payload.proxy, deadline, owner)
        self.payload_delegations.touch(client.service, payload.proxy.identity, owner)

    def _finals(
        self,
        client: ArexClient,
        final: Mapping[str, str],
        by_ce: Mapping[str, str],
        deadline: Deadline,
    ) -> dict[str, JobStatus]:
        """The pilots that finished or failed, with their exit code and the CE's error (one
        ``info`` POST); without it, FAILED is failed and FINISHED done, reasons unknown."""
        if not final:
            return {}
        found: dict[str, JobStatus] = {}
        try:
            answer, _ = client.manage("info", list(final), deadline)
        except ArexError as exc:
            logger.info(
                "{}: info of {} finished pilot(s) failed: {}", client.service, len(final), exc
            )
            answer = []
        for entry in answer:
            if entry.code == 200 and entry.id in final:
                found[by_ce[entry.id]] = info_status(
                    by_ce[entry.id], final[entry.id], entry.activity
                )
        for identifier, native in final.items():
            job_id = by_ce[identifier]
            if job_id not in found:
                found[job_id] = JobStatus(
                    job_id=job_id,
                    state=pilot_state(native, None),  # type: ignore[arg-type]
                    native=native,
                )
        return found

    def _sample_stderr(
        self, client: ArexClient, statuses: dict[str, JobStatus], deadline: Deadline
    ) -> None:
        """Add the end of a few failed pilots' stderr (read from the job's session folder) to
        their reason."""
        keep = self.settings.stderr_bytes
        failed = [s for s in statuses.values() if s.state == "failed"][
            : self.settings.stderr_samples
        ]
        if keep <= 0:
            return
        for status in failed:
            try:
                data = client.file_tail(ce_id(status.job_id), STDERR, keep, deadline)
            except ArexError as exc:
                logger.info("{}: stderr of {}: {}", client.service, status.job_id, exc)
                continue
            tail = " ".join(data.decode("utf-8", "replace").split())
            if tail:
                statuses[status.job_id] = with_stderr(status, tail)

    def pilot_output(
        self,
        ce: CE,
        job_id: str,
        stream: OutputStream,
        name: str,
        size: int,
        from_end: bool,
        timeout: float,
    ) -> PilotOutput:
        """One stream of a pilot from its session folder (:func:`.output.session_output`)."""
        credential = self.credential()
        if credential.problem:
            return PilotOutput(job_id, stream, ok=False, message=credential.problem)
        client = self.client(self.service(ce, [job_id]), credential)
        deadline = self.settings.deadline(timeout)
        return session_output(client, job_id, stream, name, size, from_end, deadline)

    # --- cancel and clean -------------------------------------------------------------------

    def cancel(self, ce: CE, ids: Sequence[str], timeout: float) -> CancelResult:
        """Kill the pilots that have not ended: their states first (``kill`` of a finished job
        answers 202 as well, trap 5, so a 202 alone would report a finished pilot cancelled),
        then one ``kill`` for the others."""
        endpoint = ce.endpoint
        credential = self.credential()
        if credential.problem:
            return CancelResult(endpoint, ok=False, message=credential.problem)
        deadline = self.settings.deadline(timeout)
        client = self.client(self.service(ce, ids), credential)
        by_ce = {ce_id(i): i for i in ids}
        try:
            states, _ = client.manage("status", list(by_ce), deadline)
            live = [
                e.id
                for e in states
                if e.code == 200
                and pilot_state(e.state, None) in ("waiting", "running")
                and e.state.upper() != "KILLING"
            ]
            if not live:
                return CancelResult(
                    endpoint,
                    ok=True,
                    message=f"none of {len(ids)} pilot(s) was still waiting or running",
                )
            answer, exchanges = client.manage("kill", live, deadline)
        except ArexError as exc:
            return CancelResult(endpoint, ok=False, command=exc.command, message=str(exc))
        cancelled = [by_ce[e.id] for e in answer if e.code in (200, 202) and e.id in by_ce]
        self.finals.note(ce, cancelled)
        left = len(ids) - len(cancelled)
        return CancelResult(
            endpoint,
            ok=True,
            cancelled=tuple(cancelled),
            command=exchanges[-1],
            message=f"{left} pilot(s) had ended or are unknown to the CE: not cancelled"
            if left
            else "",
        )

    def clean(self, ce: CE, ids: Sequence[str], timeout: float) -> list[str]:
        """``action=clean`` for pilots recorded final: the ids the CE no longer has (404). A ``202 Queued for cleaning`` is not proof (trap 5): a job
        still being killed when the clean came stayed on A-REX at load, so a queued id stays
        to clean and is asked again at the next pass, until the CE answers that it is gone."""
        credential = self.credential()
        problem = credential.problem
        if not problem:
            deadline = self.settings.deadline(timeout)
            client = self.client(self.service(ce, ids), credential)
            by_ce = {ce_id(i): i for i in ids}
            try:
                answer, _ = client.manage("clean", list(by_ce), deadline)
            except ArexError as exc:
                problem = str(exc)
            else:
                return [by_ce[e.id] for e in answer if e.code == 404 and e.id in by_ce]
        logger.info(
            "{}: cleaning failed ({}); {} pilot(s) stay to clean",
            ce.endpoint.key,
            clip(problem),
            len(ids),
        )
        return []

    def sweep(self, services: Sequence[str], timeout: float) -> list[str]:
        """Delete delegations of this credential that none of ``services`` uses (see
        :meth:`.delegation.Delegations.sweep`)."""
        credential = self.credential()
        if credential.problem:
            return []
        delegations, proxy = self.delegations, credential.proxy
        if proxy is None:  # auth: token: the payload proxy's, made under the token
            payload = self.payload.read()
            delegations, proxy = self.payload_delegations, payload.proxy if payload else None
        if proxy is None:
            return []
        deadline = Deadline.after(timeout)
        return delegations.sweep(
            services,
            proxy.identity,
            lambda service: self.client(service, credential),
            deadline,
            proxy.attributes,
            credential.owner(),
        )


def _no_command() -> CommandResult:
    return CommandResult(argv=("POST",), returncode=1, stderr="nothing was created")


def _utc(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def _unreached(error: ArexError) -> bool:
    """Whether ``error`` is the CE out of reach (no HTTP answer: refused, reset, cut, timed
    out) rather than a refusal it answered."""
    return error.http is not None and error.status is None and not error.entry
