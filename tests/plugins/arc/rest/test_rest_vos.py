"""Two VOs on one real CE (issue 44): a director with two named tokens of two subjects, one
demand group each, on one endpoint of the private A-REX. Each group's pilots are created under
its own identity (the CE's own record of the job says whose it is), and followed to their end
with it: A-REX answers for a job only to the identity that created it, so a pilot asked about
with the other VO's token would look gone. Then one VO's token expires: its group gets no pilot
and is told under the credential's name, and the other VO goes on submitting."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.polling import until
from support.ports import free_port

from gridgate.core.config import load_config
from gridgate.core.engine.director import Director, summary_json
from gridgate.plugins.arc.documents import delegation_record
from gridgate.plugins.arc.rest.delegation import PREFIX
from gridgate.plugins.arc.rest.jobs import ce_id

pytestmark = pytest.mark.xdist_group("arc")

SUBJECTS = {"atlas": "atlas-pilot-factory", "lhcb": "lhcb-pilot-factory"}


def _site(arc: Any, folder: Path, demand: Any) -> Path:
    tokens = {}
    for vo, subject in SUBJECTS.items():
        path = folder / f"{vo}.token"
        path.write_text(arc.token(sub=subject), encoding="utf-8")
        path.chmod(0o600)
        tokens[f"{vo}-token"] = {"kind": "bearer_token", "path": str(path), "renew": []}
    script = folder / "pilot.sh"
    script.write_text("#!/bin/sh\necho pilot of $(id -un)\n", encoding="utf-8")
    script.chmod(0o755)
    doc = {
        "director": {
            "state_dir": str(folder / "state"),
            "command_timeout": 60,
            "max_threads": 2,
        },
        "state": {"driver": "sqlite", "path": str(folder / "state" / "state.db")},
        "credentials": tokens,
        "backends": {
            "arc": {
                "interface": "rest",
                "auth": "token",
                "endpoints": [arc.url],
                "script": str(script),
                "env": {"X509_CERT_DIR": str(arc.certificates)},
                "credential": "atlas-token",  # the CE's: the atlas group names none
            }
        },
        "demand": {"static": {"arc": demand}},
    }
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _subject(arc: Any, job: str) -> str:
    local = Path(arc.folder, "control", f"job.{ce_id(job)}.local").read_text(errors="replace")
    return next(ln.partition("=")[2] for ln in local.splitlines() if ln.startswith("subject="))


def _control(arc: Any, job: str) -> dict[str, str]:
    """What the CE's control folder holds of ``job``: each file's first line."""
    out = {}
    for path in Path(arc.folder, "control").rglob(f"job.{ce_id(job)}.*"):
        out[path.name.rsplit(".", 1)[-1]] = path.read_text(errors="replace")[:80]
    return out


def test_two_vos_on_one_ce_each_group_created_and_followed_under_its_own_identity(
    arc, tmp_path
) -> None:
    groups = [
        {"group": "atlas", "pilots": 1},
        {"group": "lhcb", "pilots": 1, "credential": "lhcb-token"},
    ]
    director = Director(load_config(_site(arc, tmp_path, groups)))
    try:
        summary = director.run_iteration()
        registry = director.state.pilot_registry()
        pilots = {p.group: p for p in registry.query()}
        assert sorted(pilots) == ["atlas", "lhcb"], summary
        subjects = {group: _subject(arc, p.job_id) for group, p in pilots.items()}
        assert subjects["atlas"] != subjects["lhcb"], subjects
        assert SUBJECTS["atlas"] in subjects["atlas"] and SUBJECTS["lhcb"] in subjects["lhcb"]

        # no more demand: the director only follows them, each with its own token
        director.config.data["demand"]["static"]["arc"] = 0

        last: list[Any] = []

        def ended() -> dict[str, str] | None:
            last[:] = [director.run_iteration()]
            states = {p.group: p.state for p in registry.query()}
            assert len(registry.query()) == 2, "no new pilot"
            return states if set(states.values()) <= {"done", "failed"} else None

        final = until(ended, timeout=240, pause=3)
        if final != {"atlas": "done", "lhcb": "done"}:
            pytest.fail(
                f"{ {p.group: (p.state, p.native, p.job_id) for p in registry.query()} }\n"
                f"the CE: { {g: _control(arc, p.job_id) for g, p in pilots.items()} }\n"
                f"{summary_json(last[0])}"
            )

        # lhcb's token expires (its renewal is someone else's, and has not happened): its
        # group gets no pilot and is told under its name; atlas goes on submitting
        (tmp_path / "lhcb.token").write_text(
            arc.token(sub=SUBJECTS["lhcb"], start=time.time() - 7200, lifetime=3600)
        )
        director.config.data["demand"]["static"]["arc"] = groups
        summary = director.run_iteration()
        sent = [r.group for r in summary.records if r.outcome == "submitted"]
        assert sent == ["atlas"], summary_json(summary)
        assert summary.credential_users == {"lhcb-token": ("arc group lhcb",)}, summary_json(
            summary
        )
        by_name = {c.name: c.usable for c in summary.credentials}
        assert by_name == {"atlas-token": True, "lhcb-token": False}
    finally:
        director.close()


#: Says whether the payload proxy A-REX names is there, and whose it is.
PROXY_PILOT = """#!/bin/sh
PATH=/usr/bin:/bin
if [ -r "$X509_USER_PROXY" ]; then
  echo proxy=present
  openssl x509 -noout -subject -nameopt compat -in "$X509_USER_PROXY"
else
  echo proxy=absent
fi
"""


def _delegation_of(arc: Any, job: str) -> str:
    description = Path(arc.folder, "control", f"job.{ce_id(job)}.description").read_text()
    (identifier,) = re.findall(r'delegationid\s*=\s*"([^"]+)"', description)
    return identifier


def test_two_vos_delegating_one_payload_proxy_to_one_ce_each_make_their_own(
    arc, rest, tmp_path
) -> None:
    """``auth: token`` with one payload proxy for two VOs (two tokens, two subjects) on one
    CE: A-REX 6.17 keeps a delegation for the identity that made it (another token asking
    for it is told it does not exist, and a job of that token naming it would run with no
    proxy: trap 8), so each VO's pilots name a delegation made under their own token, and
    each finds the payload proxy in its job."""
    proxy = tmp_path / "payload.pem"
    arc.make_proxy(proxy)
    groups = [
        {"group": "atlas", "pilots": 1},
        {"group": "lhcb", "pilots": 1, "credential": "lhcb-token"},
    ]
    site = _site(arc, tmp_path, groups)
    doc = yaml.safe_load(site.read_text())
    doc["credentials"]["payload-proxy"] = {"kind": "x509_proxy", "path": str(proxy)}
    arc_section = doc["backends"]["arc"]
    arc_section["payload"] = {"credential": "payload-proxy"}
    arc_section["keep_on_ce"] = True  # the test reads each pilot's output from its session
    arc_section["env"]["X509_USER_PROXY"] = str(tmp_path / "none")  # the tokens reach the CE
    (tmp_path / "pilot.sh").write_text(PROXY_PILOT, encoding="utf-8")
    site.write_text(yaml.safe_dump(doc), encoding="utf-8")
    tokens = {vo: (tmp_path / f"{vo}.token").read_text() for vo in SUBJECTS}

    director = Director(load_config(site))
    try:
        summary = director.run_iteration()
        registry = director.state.pilot_registry()
        pilots = {p.group: p.job_id for p in registry.query()}
        assert sorted(pilots) == ["atlas", "lhcb"], summary_json(summary)
        delegations = {vo: _delegation_of(arc, job) for vo, job in pilots.items()}
        assert delegations["atlas"] != delegations["lhcb"], delegations
        # each delegation is its maker's on the CE: the other VO's token does not see it
        for vo, other in (("atlas", "lhcb"), ("lhcb", "atlas")):
            mine = f"/delegations/{delegations[vo]}?action=get"
            assert rest(arc, "POST", mine, tokens[vo]).status == 200, vo
            assert rest(arc, "POST", mine, tokens[other]).status != 200, (vo, other)
        # the store keeps one record per owner: the token's ISS/SUB
        owners = sorted(
            delegation_record(text).owner
            for key, text in director.state.items(PREFIX)
            if "/" not in key[len(PREFIX) :]
        )
        assert owners == sorted(f"token {arc.issuer_url}/{s}" for s in SUBJECTS.values())

        def output(vo: str) -> str | None:
            job = ce_id(pilots[vo])
            status = rest(arc, "POST", "/jobs?action=status", tokens[vo], {"job": [{"id": job}]})
            state = status.json()["job"]["state"]
            if state not in ("FINISHED", "FAILED"):
                return None
            answer = rest(arc, "GET", f"/jobs/{job}/session/pilot.out", tokens[vo])
            return f"{state}\n{answer.body.decode(errors='replace')}"

        for vo in SUBJECTS:
            out = until(lambda vo=vo: output(vo), timeout=180, pause=2)
            assert out is not None and out.startswith("FINISHED\nproxy=present\n"), (vo, out)
            rest(
                arc, "POST", "/jobs?action=clean", tokens[vo], {"job": [{"id": ce_id(pilots[vo])}]}
            )
        # both pilots ended, as a poll would record (a live pilot's poll is a use of its
        # delegation); then the CE leaves the config and the delegations stay unused an hour:
        # the sweep deletes each VO's with that VO's own token (A-REX lets only their maker
        # see or delete them)
        registry.put([p.moved("done", time.time()) for p in registry.query()])
        for key, text in director.state.items(PREFIX):
            if "/" not in key[len(PREFIX) :]:
                record = json.loads(text)
                director.state.set(key, json.dumps({**record, "used": record["used"] - 3700}))
        director.close()
        arc_section["endpoints"] = [f"https://localhost:{free_port()}/arex"]
        site.write_text(yaml.safe_dump(doc), encoding="utf-8")
        director = Director(load_config(site))
        director.run_iteration()
        for vo in SUBJECTS:
            mine = f"/delegations/{delegations[vo]}?action=get"
            assert rest(arc, "POST", mine, tokens[vo]).status == 404, vo
        assert [k for k, _t in director.state.items(PREFIX) if "/" not in k[len(PREFIX) :]] == []
    finally:
        director.close()
