"""The calls of A-REX's REST interface that the `arc` backend makes, over gridgate's one HTTP
client (:mod:`gridgate.core.http`).

One :class:`ArexClient` per CE service (``https://host:port/arex``). It asks the CE which
versions it speaks (``GET /arex/rest``) once and uses the newest it knows of 1.1 and 1.0 (A-REX
6.17 has only 1.0; 1.1 passes the delegation and queue as query parameters as well). Every
failure is an :class:`ArexError` carrying the exchange as a
:class:`~gridgate.core.model.CommandResult` (``argv`` the method and URL, ``stderr`` what went
wrong, ``stdout`` the CE's answer, ``stdout_truncated`` past the cap, ``timed_out`` at the
deadline), so that the backend's classifier reads a REST failure as it reads a command's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import quote

from gridgate.core.backend import Deadline
from gridgate.core.documents import DocumentError
from gridgate.core.http import HttpClient, HttpError, Response
from gridgate.core.model import CommandResult
from gridgate.plugins.arc.documents import (
    Entry,
    content_range_total,
    delegation_id,
    job_answer,
    rest_versions,
)

__all__ = ["SUPPORTED", "ArexClient", "ArexError", "evidence", "failed"]

#: The REST versions this client speaks, newest first.
SUPPORTED: tuple[str, ...] = ("1.1", "1.0")
JSON = "application/json"
#: Ids per management POST: one request for a CE's pilots unless the fleet is very large.
CHUNK = 1000
#: How much of a successful answer the evidence keeps.
EVIDENCE_BYTES = 4096


def failed(command: CommandResult, line: str) -> CommandResult:
    """``command`` (an exchange that was answered) as a failure saying ``line``: an answer the
    client cannot read, or one job's failed entry in it."""
    return dataclasses.replace(command, returncode=1, stderr=line)


def evidence(method: str, url: str, outcome: Response | HttpError) -> CommandResult:
    """The exchange as a command's result: ``returncode`` 0 for an answer, 1 for a failure,
    None when cut at the deadline; ``stderr`` the failure (``HTTP 403 User can't be assigned
    configuration``, ``connect: Connection refused``, ``TLS: certificate verify failed: ...``)."""
    if isinstance(outcome, Response):
        return CommandResult(
            argv=(method, url),
            returncode=0,
            stdout=outcome.body[:EVIDENCE_BYTES].decode("utf-8", "replace"),
            duration=outcome.duration,
        )
    prefix = {
        "connect": "connect: ",
        "tls": "TLS: ",
        "send": "send: ",
        "receive": "receive: ",
        "timeout": "timeout: ",
        "too_large": "too large: ",
        "status": "",
    }[outcome.phase]
    return CommandResult(
        argv=(method, url),
        returncode=None if outcome.phase == "timeout" else 1,
        stdout=outcome.body.decode("utf-8", "replace"),
        stderr=prefix + outcome.detail,
        timed_out=outcome.phase == "timeout",
        duration=outcome.duration,
        stdout_truncated=outcome.phase == "too_large",
    )


class ArexError(Exception):
    """A REST call that failed, or one job's entry in its answer (``entry``): ``command`` is
    the exchange (see :func:`evidence`), ``http`` the HTTP client's error when there was one
    (None for an answer the client could not read, or an entry's failure),
    :attr:`lost` whether the CE may have acted on a request whose answer never came."""

    def __init__(
        self,
        message: str,
        command: CommandResult,
        http: HttpError | None = None,
        *,
        entry: bool = False,
    ) -> None:
        super().__init__(message)
        self.command = command
        self.http = http
        #: one job's part of an answer failed (the request itself was answered)
        self.entry = entry

    @property
    def lost(self) -> bool:
        """Whether the request may have reached the CE and its answer was lost (broken off,
        cut at the deadline or past the cap, or unreadable): what it did there is unknown."""
        if self.http is None:
            return True
        return self.http.sent and self.http.phase in ("receive", "timeout", "too_large")

    @property
    def status(self) -> int | None:
        return self.http.status if self.http is not None else None


class ArexClient:
    """REST calls to one A-REX service.

    :param service: the CE's URL as configured (``https://ce.example.org:443/arex``).
    :param http: the HTTP client (its TLS settings and client certificate).
    :param headers: called before each request for extra headers (``Authorization``).
    :param max_bytes: the cap on every answer (the site's ``director.max_output_bytes``).
    """

    def __init__(
        self,
        service: str,
        http: HttpClient,
        *,
        headers: Callable[[], Mapping[str, str]] = dict,
        max_bytes: int,
    ) -> None:
        self.service = service.rstrip("/")
        self.http = http
        self.headers = headers
        self.max_bytes = max_bytes
        self.version: str | None = None

    # --- plumbing --------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        url: str,
        deadline: Deadline,
        *,
        body: bytes | str | None = None,
        content_type: str = "",
        accept: str = JSON,
        expect: Sequence[int] = (200,),
        idempotent: bool | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> Response:
        headers = {"Accept": accept, **self.headers(), **(extra or {})}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            return self.http.request(
                method,
                url,
                timeout=deadline.left(),
                body=body,
                headers=headers,
                max_bytes=self.max_bytes,
                expect=expect,
                idempotent=idempotent,
            )
        except HttpError as exc:
            raise ArexError(str(exc), evidence(method, url, exc), exc) from None

    def _unreadable(self, method: str, url: str, answer: Response, why: str) -> ArexError:
        line = f"unreadable answer: {why}"
        return ArexError(f"{method} {url}: {line}", failed(evidence(method, url, answer), line))

    def base(self, deadline: Deadline) -> str:
        """``SERVICE/rest/VERSION``, the version asked of the CE on first use."""
        return f"{self.service}/rest/{self.discover(deadline)}"

    def discover(self, deadline: Deadline) -> str:
        """The version to speak: the newest of :data:`SUPPORTED` that ``GET /rest`` lists.

        :raises ArexError: when the CE has no REST interface there or offers none of them."""
        if self.version is not None:
            return self.version
        url = f"{self.service}/rest"
        answer = self._request("GET", url, deadline)
        try:
            offered = rest_versions(answer.body)
        except DocumentError as exc:
            raise self._unreadable("GET", url, answer, f"no version list ({exc})") from None
        for version in SUPPORTED:
            if version in offered:
                self.version = version
                return version
        line = (
            f"Version Not Supported: the CE offers REST {', '.join(offered) or 'nothing'}; "
            f"gridgate speaks {', '.join(SUPPORTED)}"
        )
        raise ArexError(line, failed(evidence("GET", url, answer), line))

    def _entries(self, method: str, url: str, answer: Response) -> list[Entry]:
        try:
            return job_answer(answer.body)
        except DocumentError as exc:
            raise self._unreadable(method, url, answer, str(exc)) from None

    # --- delegations -------------------------------------------------------------------------

    def delegation_new(self, deadline: Deadline) -> tuple[str, bytes]:
        """A new delegation: its id and the CE's certificate request (PEM).

        The id is the last ``/`` element of the raw ``Location`` header
        (:func:`.documents.delegation_id`: trap 2)."""
        url = f"{self.base(deadline)}/delegations?action=new"
        answer = self._request("POST", url, deadline, accept="*/*", expect=(201,))
        try:
            return delegation_id(answer.header("location")), answer.body
        except DocumentError:
            raise self._unreadable("POST", url, answer, "no delegation id in Location") from None

    def delegation_renew(self, identifier: str, deadline: Deadline) -> bytes:
        """A new certificate request for delegation ``identifier`` (made anew by the CE when
        it had lost it: A-REX 6.17 renews an unknown id too, trap 9)."""
        url = f"{self.base(deadline)}/delegations/{identifier}?action=renew"
        return self._request("POST", url, deadline, accept="*/*", expect=(201,)).body

    def delegation_put(self, identifier: str, pem: bytes, deadline: Deadline) -> None:
        """Hand the signed certificate of delegation ``identifier`` to the CE."""
        url = f"{self.base(deadline)}/delegations/{identifier}"
        self._request(
            "PUT",
            url,
            deadline,
            body=pem,
            content_type="application/x-pem-file",
            accept="*/*",
            expect=(200, 201, 204),
        )

    def delegation_exists(self, identifier: str, deadline: Deadline) -> bool:
        """Whether the CE still has delegation ``identifier`` (``action=get``: 200 or 404)."""
        url = f"{self.base(deadline)}/delegations/{identifier}?action=get"
        answer = self._request(
            "POST", url, deadline, accept="*/*", expect=(200, 404), idempotent=True
        )
        return answer.status == 200

    def delegation_delete(self, identifier: str, deadline: Deadline) -> None:
        """Delete delegation ``identifier`` on the CE (gone already is fine)."""
        url = f"{self.base(deadline)}/delegations/{identifier}?action=delete"
        self._request("POST", url, deadline, accept="*/*", expect=(200, 202, 404), idempotent=True)

    # --- jobs ------------------------------------------------------------------------------

    def create_jobs(
        self, description: str, deadline: Deadline, *, delegation: str = "", queue: str = ""
    ) -> tuple[list[Entry], CommandResult]:
        """``POST jobs?action=new`` of one description or a bundle: one entry per job, in the
        bundle's order, and the exchange. Never repeated on a broken connection (it may have
        created the jobs): an :class:`ArexError` with ``lost`` then says the answer was lost."""
        version = self.discover(deadline)
        url = f"{self.service}/rest/{version}/jobs?action=new"
        if version != "1.0":
            url += "".join(
                f"&{name}={value}"
                for name, value in (("delegation_id", delegation), ("queue", queue))
                if value
            )
        answer = self._request(
            "POST",
            url,
            deadline,
            body=description,
            content_type="application/rsl",
            expect=(201,),
            idempotent=False,
        )
        return self._entries("POST", url, answer), evidence("POST", url, answer)

    def put_file(self, identifier: str, name: str, data: bytes, deadline: Deadline) -> None:
        """Upload ``data`` as ``name`` into job ``identifier``'s session folder."""
        url = f"{self.base(deadline)}/jobs/{identifier}/session/{name}"
        self._request(
            "PUT",
            url,
            deadline,
            body=data,
            content_type="application/octet-stream",
            accept="*/*",
            expect=(200, 201, 204),
        )

    def manage(
        self, action: str, identifiers: Sequence[str], deadline: Deadline
    ) -> tuple[list[Entry], list[CommandResult]]:
        """``POST jobs?action=ACTION`` (status, info, kill, clean) for ``identifiers``, in
        chunks of :data:`CHUNK`: the entries in request order, and each chunk's exchange."""
        found: list[Entry] = []
        exchanges: list[CommandResult] = []
        url = f"{self.base(deadline)}/jobs?action={action}"
        for start in range(0, len(identifiers), CHUNK):
            chunk = identifiers[start : start + CHUNK]
            body = json.dumps({"job": [{"id": i} for i in chunk]})
            answer = self._request(
                "POST",
                url,
                deadline,
                body=body,
                content_type=JSON,
                expect=(201, 200),
                idempotent=True,  # asking again, killing or cleaning again does no harm
            )
            got = self._entries("POST", url, answer)
            if len(got) != len(chunk):
                raise self._unreadable(
                    "POST", url, answer, f"{len(got)} entries for {len(chunk)} jobs"
                )
            found += got
            exchanges.append(evidence("POST", url, answer))
        return found, exchanges

    def info(self, deadline: Deadline) -> bytes:
        """The CE's GLUE2 document (``GET info``, as JSON): its shares and endpoints."""
        return self._request("GET", f"{self.base(deadline)}/info", deadline).body

    def list_jobs(self, deadline: Deadline) -> list[str]:
        """The ids of every job of this credential on the CE (``GET jobs``)."""
        url = f"{self.base(deadline)}/jobs"
        answer = self._request("GET", url, deadline)
        return [e.id for e in self._entries("GET", url, answer) if e.id]

    def description(self, identifier: str, deadline: Deadline) -> bytes:
        """The description A-REX keeps of job ``identifier`` (``diagnose/description``: the
        xRSL as it parsed it, the ``jobname`` in it)."""
        url = f"{self.base(deadline)}/jobs/{identifier}/diagnose/description"
        return self._request("GET", url, deadline, accept="*/*").body

    def file_tail(self, identifier: str, name: str, size: int, deadline: Deadline) -> bytes:
        """The last ``size`` bytes of ``name`` in job ``identifier``'s session folder (b"" when
        it has no such file: :meth:`file_part` from its end)."""
        found = self.file_part(identifier, name, size, True, deadline)
        return b"" if found is None else found[0]

    def session_url(self, identifier: str, name: str, deadline: Deadline) -> str:
        """The URL of ``name`` in job ``identifier``'s session folder, the name percent-encoded
        whole (``%2e%2e`` stays a name: it cannot reach the CE as ``..``)."""
        return f"{self.base(deadline)}/jobs/{identifier}/session/{quote(name, safe='')}"

    def file_part(
        self, identifier: str, name: str, size: int, from_end: bool, deadline: Deadline
    ) -> tuple[bytes, int] | None:
        """At most ``size`` bytes of ``name`` in job ``identifier``'s session folder (its start,
        or its end with ``from_end``) and the file's length; None when the CE answers 404 (it
        holds no such job, or the job no such file).

        A-REX 6.17 honours ``Range: bytes=A-B`` but not a suffix range (``bytes=-N``), so the
        first byte is asked first, whose ``Content-Range`` tells the length (an empty file
        answers 200 with no body there; 416, Range Not Satisfiable, is read alike); the rest
        comes in ranges of at most the client's cap on a body."""
        url = self.session_url(identifier, name, deadline)
        probe = self._request(
            "GET",
            url,
            deadline,
            accept="*/*",
            expect=(200, 206, 404, 416),
            extra={"Range": "bytes=0-0"},
        )
        if probe.status == 404:
            return None
        if probe.status == 416:
            return b"", 0
        if probe.status == 200:  # the whole file came (no range support)
            whole = probe.body
            if size <= 0:
                return b"", len(whole)
            return (whole[-size:] if from_end else whole[:size]), len(whole)
        try:
            total = content_range_total(probe.header("content-range"))
        except DocumentError:
            raise self._unreadable("GET", url, probe, "no length in Content-Range") from None
        want = min(max(size, 0), total)
        if want == 0:
            return b"", total
        start = total - want if from_end else 0
        if start == 0 and want == 1:
            return probe.body[:1], total
        parts: list[bytes] = []
        at = start
        while at < start + want:
            last = min(start + want, at + max(self.max_bytes, 1)) - 1
            answer = self._request(
                "GET",
                url,
                deadline,
                accept="*/*",
                expect=(200, 206),
                extra={"Range": f"bytes={at}-{last}"},
            )
            chunk = answer.body[at : last + 1] if answer.status == 200 else answer.body
            if not chunk:
                break
            parts.append(chunk[: last + 1 - at])
            at += len(parts[-1])
        return b"".join(parts), total
