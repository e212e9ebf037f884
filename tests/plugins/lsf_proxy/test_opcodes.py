"""Batch opcodes and request sizes of gated commands, for the diagnostic log."""

from __future__ import annotations

import pytest

from gridgate.plugins.lsf_proxy.config import category_of
from gridgate.plugins.lsf_proxy.opcodes import COMMAND_OPCODES, opcode_of, request_of


@pytest.mark.parametrize("argv, opcode", [
    (["bjobs", "-u", "all"], "BATCH_JOB_QUERY"),          # the seed's log
    (["/usr/lsf/bin/bhosts"], "BATCH_HOST_INFO"),          # the seed's log
    (["bsub", "-q", "normal", "sleep", "1"], "BATCH_JOB_SUB"),  # the seed's log
    (["brsvdel", "r1"], "BATCH_REMOVE_RSV"),               # the seed's log
    (["bqueues"], "BATCH_QUE_INFO"), (["bkill", "12"], "BATCH_JOB_SIG"),
    (["squeue", "-u", "alice"], "REQUEST_JOB_INFO"), (["sinfo"], "REQUEST_NODE_INFO"),
    (["sbatch", "job.sh"], "REQUEST_SUBMIT_BATCH_JOB"), (["scancel", "7"], "REQUEST_KILL_JOB"),
    (["sacct", "-j", "7"], "DBD_GET_JOBS_COND"),
    (["scontrol", "show", "job", "7"], "REQUEST_JOB_INFO"),
    (["scontrol", "-o", "show", "partition"], "REQUEST_PARTITION_INFO"),
    (["scontrol", "hold", "7"], "REQUEST_UPDATE_JOB"),
    (["my_tool", "x"], "my_tool"),                         # not in the table: its own name
])
def test_opcode_of_commands(argv, opcode):
    assert request_of(argv)[0] == opcode
    assert opcode_of(opcode) == opcode  # an opcode stays itself


def test_size_is_the_bytes_of_the_arguments():
    assert request_of(["bjobs", "-u", "all"]) == ("BATCH_JOB_QUERY", 6 + 3 + 4)
    assert request_of(["bsub", "é"], "BATCH_JOB_SUB") == ("BATCH_JOB_SUB", 5 + 3)
    assert request_of(["bjobs"], opcode="MY_OPCODE") == ("MY_OPCODE", 6)  # gate --opcode wins


def test_each_opcode_is_in_its_commands_category():
    for command, opcode in COMMAND_OPCODES.items():
        if category_of(command) != "other":
            assert category_of(opcode) == category_of(command), (command, opcode)
    assert category_of("REQUEST_JOB_INFO") == category_of("squeue") == "query"
    assert category_of("REQUEST_SUBMIT_BATCH_JOB") != "query"
