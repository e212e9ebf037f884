"""The one table of batch commands (plugins/lsf_proxy/commands.py): the daemon, the gate and the
LSF backend count a command alike, and docs/proxyd.md shows the table as it is."""

from __future__ import annotations

import re
from pathlib import Path

from gridgate.plugins.lsf_proxy.commands import (
    COMMANDS,
    SHIM_COMMANDS,
    SUBMITTING,
    category_map,
    category_of,
    opcode_of,
)
from gridgate.plugins.lsf_proxy.gate.gating import gate_category_map, infer_category, submits

DOCS = Path(__file__).resolve().parents[3] / "docs"


def test_the_daemon_and_the_gate_give_every_command_and_opcode_its_row_s_category() -> None:
    for name, row in COMMANDS.items():
        assert category_of(name) == infer_category(name) == row.category, name
        if row.opcode:
            # a request that names only its opcode waits where its command would
            assert category_of(row.opcode) == row.category, (name, row.opcode)
    assert gate_category_map() == category_map()


def test_the_config_s_categories_win_for_the_daemon_and_the_gate() -> None:
    section = {"categories": {"query": ["bsub", "mytool"]}}
    daemon = category_map(section["categories"])
    assert category_of("bsub", daemon) == infer_category("bsub", section) == "query"
    assert category_of("mytool", daemon) == infer_category("mytool", section) == "query"
    assert category_of("mytool") == infer_category("mytool") == "other"


def test_scontrol_show_is_a_query_to_the_gate_and_to_the_log() -> None:
    assert infer_category("scontrol", None, ["-o", "show", "job", "12"]) == "query"
    assert infer_category("scontrol", None, ["update", "job=12"]) == "other"
    assert opcode_of("scontrol", query=True) == "REQUEST_JOB_INFO"
    assert opcode_of("scontrol") == "REQUEST_UPDATE_JOB"


def test_the_submission_commands_never_carry_the_token_and_have_shims_where_known() -> None:
    assert {n for n in COMMANDS if submits(n)} == SUBMITTING
    assert {"bsub", "sbatch", "qsub", "condor_submit", "arcsub"} <= SUBMITTING
    assert SHIM_COMMANDS[:5] == ("bjobs", "bhosts", "bqueues", "bhist", "busers")
    assert len(set(SHIM_COMMANDS)) == len(SHIM_COMMANDS)


def test_the_lsf_backend_takes_its_tokens_by_the_table() -> None:
    # bjobs polls, bsub submits, bkill cancels (director/backend.py, director/tracking.py)
    assert [COMMANDS[n].category for n in ("bjobs", "bsub", "bkill")] == [
        "query",
        "submission",
        "other",
    ]


def test_docs_proxyd_shows_the_table() -> None:
    text = (DOCS / "proxyd.md").read_text(encoding="utf-8")
    rows = re.findall(
        r"^  \| `([a-z_]+)` \| (`[A-Z_]+`|\(its name\)) \| (\w+) \| (yes|) \|$", text, re.M
    )
    shown = {
        name: (opcode.strip("`"), category, shim == "yes") for name, opcode, category, shim in rows
    }
    table = {
        name: (row.opcode or "(its name)", row.category, row.shim) for name, row in COMMANDS.items()
    }
    assert shown == table
