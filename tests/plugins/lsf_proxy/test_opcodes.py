"""Batch opcodes and request sizes of gated commands, for the diagnostic log."""

from __future__ import annotations

import pytest

from gridgate.plugins.lsf_proxy.commands import (
    COMMAND_OPCODES,
    category_of,
    opcode_of,
    request_size,
)


@pytest.mark.parametrize(
    "command, opcode",
    [
        ("bjobs", "BATCH_JOB_QUERY"),  # the seed's log
        ("/usr/lsf/bin/bhosts", "BATCH_HOST_INFO"),  # the seed's log
        ("bsub", "BATCH_JOB_SUB"),  # the seed's log
        ("brsvdel", "BATCH_REMOVE_RSV"),  # the seed's log
        ("bqueues", "BATCH_QUE_INFO"),
        ("bkill", "BATCH_JOB_SIG"),
        ("squeue", "REQUEST_JOB_INFO"),
        ("sinfo", "REQUEST_NODE_INFO"),
        ("sbatch", "REQUEST_SUBMIT_BATCH_JOB"),
        ("scancel", "REQUEST_KILL_JOB"),
        ("sacct", "DBD_GET_JOBS_COND"),
        ("scontrol", "REQUEST_UPDATE_JOB"),
        ("my_tool", "my_tool"),  # not in the table: its own name
    ],
)
def test_opcode_of_commands(command, opcode):
    assert opcode_of(command) == opcode
    assert opcode_of(opcode) == opcode  # an opcode stays itself


def test_scontrol_show_is_logged_as_a_query():
    assert opcode_of("scontrol", query=True) == "REQUEST_JOB_INFO"


def test_size_is_the_bytes_of_the_arguments():
    assert request_size(["bjobs", "-u", "all"]) == 6 + 3 + 4
    assert request_size(["bsub", "é"]) == 5 + 3


def test_each_opcode_is_in_its_commands_category():
    for command, opcode in COMMAND_OPCODES.items():
        if category_of(command) != "other":
            assert category_of(opcode) == category_of(command), (command, opcode)
    assert category_of("REQUEST_JOB_INFO") == category_of("squeue") == "query"
    assert category_of("REQUEST_SUBMIT_BATCH_JOB") != "query"
