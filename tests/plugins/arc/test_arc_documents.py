"""The `arc` backend's boundary (plugins/arc/documents.py): every outside document of a kind is
read by one function, and each way one can be wrong is one DocumentError, in the document
that carries it: a shape A-REX never sends, an id the next step would refuse, a count that is
not ASCII digits, an ``exp`` no clock reaches."""

from __future__ import annotations

import base64
import json
import re

import pytest

from gridgate.core.credential_names import credentials_in_force
from gridgate.core.documents import DocumentError
from gridgate.plugins.arc.documents import (
    DelegationRecord,
    arc_conf,
    arcstat_report,
    ce_record,
    content_range_total,
    delegation_id,
    delegation_record,
    issuer_record,
    job_answer,
    rest_marker,
    rest_versions,
    stamps,
    submitted_ids,
    token_end,
    token_owner,
)
from gridgate.plugins.arc.rest.interface import Credential, token_expired
from gridgate.plugins.arc.rest.jobs import info_status

JOB = "https://localhost:18443/arex/rest/1.0/jobs/ClMNDms32sAoOSAtDmABFKDmmVLKDmsiiqMm"


def _token(claims: str) -> str:
    part = base64.urlsafe_b64encode(claims.encode()).rstrip(b"=").decode()
    return f"e30.{part}.c2ln"


def test_a_job_answer_is_read_in_every_shape_a_rest_shows() -> None:
    one = b'{"job":{"status-code":"201","reason":"Created","id":"RwGKDmt32s","state":"ACCEPTING"}}'
    many = (
        b'{"job":[{"status-code":"200","reason":"OK","id":"ClMN","state":"ACCEPTED"},'
        b'{"status-code":"404","reason":"Job not found","id":"NoSuchJobAAAA","state":"None"}]}'
    )
    assert [(e.code, e.id, e.state) for e in job_answer(one)] == [(201, "RwGKDmt32s", "ACCEPTING")]
    assert [(e.code, e.reason) for e in job_answer(many)] == [(200, "OK"), (404, "Job not found")]
    assert job_answer(b"") == [] and job_answer(b"  \n") == []  # an empty list: an empty body
    listing = job_answer(b'{"job":[{"id":"A1"},{"id":"B2"}]}')  # GET jobs: ids only
    assert [(e.code, e.id) for e in listing] == [(200, "A1"), (200, "B2")]


def test_an_info_answer_carries_the_activity_a_final_pilot_is_read_from() -> None:
    body = json.dumps(
        {
            "job": {
                "status-code": "200",
                "reason": "OK",
                "id": "ClMN",
                "info_document": {
                    "ComputingActivity": {
                        "Name": "gg-demo-1",
                        "State": ["nordugrid:FINISHED", "arcrest:FINISHED"],
                        "ExitCode": "3",
                        "Error": "LRMS error: (3) Job finished with wrong exit code",
                    }
                },
            }
        }
    ).encode()
    [entry] = job_answer(body)
    assert entry.activity is not None and entry.activity.name == "gg-demo-1"
    status = info_status(JOB, "FINISHED", entry.activity)
    assert (status.state, status.exit_code) == ("failed", 3)
    assert status.reason == "LRMS error: (3) Job finished with wrong exit code"


def test_a_job_too_young_for_an_info_document_is_an_entry_without_activity() -> None:
    """A-REX 6.17 answers ``info`` for a job its info provider has not seen yet with a text
    where the document goes: that job has no activity (its name is read elsewhere), and the
    other jobs of the answer are still read."""
    body = b'{"job":[{"status-code":"200","id":"A1","info_document":""},'
    body += b'{"status-code":"200","id":"B2","info_document":{"ComputingActivity":{"Name":"n"}}}]}'
    young, named = job_answer(body)
    assert young.activity is None and young.id == "A1"
    assert named.activity is not None and named.activity.name == "n"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"job":{"status-code":"abc","id":"A1"}}', "status-code"),
        (b'{"job":{"status-code":"2010","id":"A1"}}', "status-code"),
        (b'{"job":{"status-code":"201","id":"../../delegations/X"}}', "id"),
        (b'{"job":{"status-code":"201","id":"A1/session"}}', "id"),
        (b'{"job":{"status-code":"201","id":""}}', "id"),
        (b'{"job":["A1"]}', "object"),
        (b'{"jobs":[]}', "job"),
        (b'{"job":{"id":"A1","info_document":{"ComputingActivity":[]}}}', "ComputingActivity"),
        (b"<html>502 Bad Gateway</html>", "JSON"),
    ],
)
def test_a_job_answer_the_next_step_would_refuse_is_refused_whole(body: bytes, why: str) -> None:
    with pytest.raises(DocumentError, match=re.compile(why, re.I)):
        job_answer(body)


def test_the_version_list_is_one_version_or_several() -> None:
    assert rest_versions(b'{"version":"1.0"}') == ("1.0",)
    assert rest_versions(b'{"version":["1.0","1.1"]}') == ("1.0", "1.1")
    with pytest.raises(DocumentError):
        rest_versions(b'{"version":1.0}')


def test_a_delegation_id_is_one_path_element_of_location() -> None:
    assert delegation_id("/arex/rest/1.0/delegations?action=new/515f323d4567") == "515f323d4567"
    for location in ("", "/arex/rest/1.0/delegations?action=new", "/x/a%2Fb", "/x/id?y=1"):
        with pytest.raises(DocumentError):
            delegation_id(location)


def test_a_content_range_total_is_ascii_digits_only() -> None:
    assert content_range_total("bytes 0-0/1234") == 1234
    # str.isdigit() takes all of these, and int() reads the first two as 123
    for header in ("bytes 0-0/١٢٣", "bytes 0-0/1_000", "bytes 0-0/²", "bytes 0-0/*", "bytes 0-0/"):
        with pytest.raises(DocumentError, match="Content-Range"):
            content_range_total(header)
    with pytest.raises(DocumentError):
        content_range_total("bytes 0-0/" + "9" * 400)


def test_a_bearer_tokens_end_is_a_time_or_the_ce_judges_the_token() -> None:
    assert token_end(_token('{"exp": 1700000000}')) == 1700000000.0
    assert token_end(_token('{"sub": "pilot"}')) is None
    assert token_expired(_token('{"exp": 100}'), now=200.0) == 100.0
    assert token_expired(_token('{"exp": 300}'), now=200.0) is None
    # a 400-digit exp raised OverflowError out of float(): now the token is not this
    # machine's to judge, and the CE answers for it
    assert token_expired(_token('{"exp": ' + "9" * 400 + "}"), now=0.0) is None
    assert token_expired(_token('{"exp": 1e400}'), now=0.0) is None
    assert token_expired("not-a-jwt", now=0.0) is None
    with pytest.raises(DocumentError):
        token_end(_token('{"exp": "soon"}'))


def test_a_bearer_tokens_owner_is_its_issuer_and_subject_as_a_rex_names_it() -> None:
    iss = '"iss": "https://iam.example.org"'
    assert token_owner(_token("{" + iss + ', "sub": "atlas"}')) == "https://iam.example.org/atlas"
    assert token_owner(_token("{" + iss + "}")) is None
    assert token_owner(_token('{"sub": "atlas"}')) is None
    for bad in ('{"sub": 5, "iss": "x"}', "[1]"):
        with pytest.raises(DocumentError):
            token_owner(_token(bad))
    with pytest.raises(DocumentError):
        token_owner("not-a-jwt")
    # a delegation's owner: the token's identity; a token that names none, its credential's
    # name (none in force outside a hook call: the kind's); a proxy owns its own
    owned = Credential("token", "/cas", token=_token("{" + iss + ', "sub": "lhcb"}'))
    assert owned.owner() == "token https://iam.example.org/lhcb"
    assert Credential("token", "/cas", token="opaque").owner() == "token credential token"
    with credentials_in_force({"token": "atlas-token"}):
        opaque = Credential("token", "/cas", token="opaque")
        assert opaque.owner() == "token credential atlas-token"
    assert Credential("x509", "/cas").owner() == ""


def test_stamps_markers_and_records_read_back_are_checked_as_well() -> None:
    assert stamps(b'{"a": 1, "b": 2.5}') == {"a": 1.0, "b": 2.5}
    assert stamps(json.dumps({JOB: 1, "no id": 2}), re.compile(re.escape(JOB))) == {JOB: 1.0}
    for bad in (b"[]", b'{"a": "x"}', b'{"a": true}', b"{"):
        with pytest.raises(DocumentError):
            stamps(bad)
    assert rest_marker(b'{"url": "https://ce/arex", "queue": ""}') == "https://ce/arex"
    with pytest.raises(DocumentError):
        rest_marker(b'{"queue": "q"}')
    record = DelegationRecord("515f323d4567", "https://ce/arex", "/CN=p", "ab", 10.0, 5.0)
    assert delegation_record(record.dump()) == record
    with pytest.raises(DocumentError):
        delegation_record(record.dump().replace("515f323d4567", "51/5f"))


def test_client_outputs_keep_only_ids_and_counts_of_their_form() -> None:
    out = f"Job submitted with jobid: {JOB}\nJob submitted with jobid: https://ce/arex/../x y\n"
    assert submitted_ids(out) == [JOB]
    # Unicode digits in the summary are not arcstat's: the line is not read
    report = arcstat_report("Status of ٣ jobs was queried, ٣ jobs returned information\n")
    assert report.queried is None and report.returned is None


def test_the_private_ces_own_records_are_read_at_the_boundary_too() -> None:
    record = ce_record(b'{"port": 18443, "lrms": "fork", "info_period": 10, "wakeup": 10}')
    assert (record.port, record.tokens, record.issuer_port) == (18443, False, None)
    for bad in (b'{"port": 0, "lrms": "fork", "info_period": 10, "wakeup": 10}', b"[]"):
        with pytest.raises(DocumentError, match="private CE record"):
            ce_record(bad)
    assert arc_conf(b'{"common": {"hostname": "localhost"}}') == {
        "common": {"hostname": "localhost"}
    }
    with pytest.raises(DocumentError, match="arcconfig-parser"):
        arc_conf(b'{"common": "localhost"}')
    assert issuer_record(b'{"url": "https://localhost:1", "kid": "k"}').kid == "k"
    with pytest.raises(DocumentError, match="issuer"):
        issuer_record(b'{"url": "https://localhost:1"}')
