"""Parsers of the gLite client's output: the formats of formats.md, and no exception ever."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gridgate.plugins.wms_glite.parse import (
    banner,
    client_messages,
    is_no_match,
    last_line,
    parse_ce_ids,
    parse_job_ids,
)

EP = "https://wms01.example.org:7443/glite_wms_wmproxy_server"
JOB = "https://lb01.example.org:9000/OoiKF7G4RqojM0xQLiiGUg"

SUBMIT_TEXT = f"""
Connecting to the service {EP}


====================== glite-wms-job-submit Success ======================

The job has been successfully submitted to the WMProxy
Your job identifier is:

{JOB}

==========================================================================


"""

LIST_MATCH_TEXT = f"""
Connecting to the service {EP}

==========================================================================

\t\t     COMPUTING ELEMENT IDs LIST\x20
 The following CE(s) matching your job requirements have been found:

\t*CEId*
 - ce01.example.org:8443/cream-pbs-long
 - ce02.example.org:2119/jobmanager-lcgpbs-grid

==========================================================================


"""

NO_MATCH_TEXT = f"""
Connecting to the service {EP}

==================== glite-wms-job-list-match failure ====================

No Computing Element matching your job requirements has been found!

==========================================================================
"""


def test_banner_is_74_columns_and_matches_formats_md() -> None:
    assert banner("glite-wms-job-submit", "Success") == (
        "====================== glite-wms-job-submit Success ======================"
    )
    assert banner("glite-wms-job-list-match", "failure") == (
        "==================== glite-wms-job-list-match failure ===================="
    )
    assert len(banner("x", "odd")) == 74


def test_job_id_from_default_text_is_the_9000_url_not_the_wms_endpoint() -> None:
    assert parse_job_ids(SUBMIT_TEXT) == (JOB,)


def test_job_id_from_nomsg() -> None:
    assert parse_job_ids(JOB + "\n") == (JOB,)


def test_job_id_from_json_single_and_parametric() -> None:
    assert parse_job_ids(json.dumps({"result": "success", "jobid": JOB, "endpoint": EP})) == (JOB,)
    children = {
        f"Node_{i}": f"https://lb01.example.org:9000/child{i}xxxxxxxxxxxxxxxxx" for i in range(3)
    }
    text = json.dumps({"result": "success", "parent": JOB, "children": children, "endpoint": EP})
    assert parse_job_ids(text) == tuple(children.values())
    assert parse_job_ids(json.dumps({"result": "success", "parent": JOB})) == (JOB,)


def test_job_id_from_output_file() -> None:
    assert parse_job_ids(f"###Submitted Job Ids###\n{JOB}\n") == (JOB,)


def test_no_job_id_when_only_the_endpoint_is_printed() -> None:
    assert parse_job_ids(f"Connecting to the service {EP}\n") == ()
    assert parse_job_ids('{"result": "failure", "endpoint": "' + EP + '"}') == ()
    assert parse_job_ids("{not json https://lb:9000/abc") == ("https://lb:9000/abc",)


def test_ce_ids_and_no_match() -> None:
    assert parse_ce_ids(LIST_MATCH_TEXT) == (
        "ce01.example.org:8443/cream-pbs-long",
        "ce02.example.org:2119/jobmanager-lcgpbs-grid",
    )
    assert not is_no_match(LIST_MATCH_TEXT)
    assert parse_ce_ids(NO_MATCH_TEXT) == ()
    assert is_no_match(NO_MATCH_TEXT)


def test_client_messages_split_errors_and_warnings() -> None:
    stderr = (
        "\nWarning - WMProxy unreachable: x\nWMProxy Server may be down\n"
        "\nError - Operation failed\nUnable to contact any specified enpoint\n\n"
    )
    messages = client_messages(stderr)
    assert [(m.level, m.header) for m in messages] == [
        ("warning", "WMProxy unreachable: x"),
        ("error", "Operation failed"),
    ]
    assert messages[1].lines == ("Unable to contact any specified enpoint",)


# Random text, random bytes decoded the way the runner decodes them, and text built from the
# pieces the parsers look for, so the fuzzing reaches the interesting branches.
_pieces = st.sampled_from(
    [
        JOB,
        EP,
        "{",
        "}",
        '"jobid"',
        '"children"',
        ":",
        ",",
        "[",
        "]",
        " - ",
        ":8443/",
        ":2119/",
        ":9000/",
        "https://",
        "\n",
        "Error - ",
        "Warning - ",
        "No Computing Element",
        "null",
        '{"children": {"a": 1}}',
        '{"jobid": null}',
        '{"children": []}',
        "\ufffd",
        "\x00",
    ]
)
_texts = st.one_of(
    st.text(),
    st.binary().map(lambda b: b.decode("utf-8", errors="replace")),
    st.lists(st.one_of(_pieces, st.text(max_size=5)), max_size=40).map("".join),
)


@settings(max_examples=400, deadline=None)
@given(_texts)
def test_parsers_never_raise(text: str) -> None:
    ids = parse_job_ids(text)
    assert all(i.startswith("https://") and ":9000/" in i for i in ids)
    assert all(":7443" not in i for i in ids)
    ces = parse_ce_ids(text)
    assert all(":8443/" in c or ":2119/" in c for c in ces)
    assert isinstance(is_no_match(text), bool)
    client_messages(text)
    last_line(text)


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text()),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=20,
    )
)
def test_json_of_any_shape_never_raises(value: object) -> None:
    parse_job_ids(json.dumps(value))
    parse_job_ids(json.dumps({"result": "success", "jobid": value, "children": value}))
