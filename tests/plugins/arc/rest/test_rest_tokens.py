"""``auth: token`` against the real private CE, whose issuer's tokens it accepts (the CE of
tests/plugins/arc/conftest.py, docs/arc.md "Bearer tokens"): a pilot submitted, followed and
cleaned with a token only, no client certificate and no delegation; an expired token sends
nothing and blames no CE; a token the CE's authgroups do not admit is ``auth``; and
``interface: cli`` with ``auth: token`` is a config error."""

from __future__ import annotations

import time

import pytest
from support.polling import until

from gridgate.core.model import Endpoint, SubmitRequest
from gridgate.core.testing import section_for
from gridgate.plugins.arc.backend import ArcBackend
from gridgate.plugins.arc.rest.jobs import ce_id

pytestmark = pytest.mark.xdist_group("arc")


def _token_backend(site, token_file):
    # no proxy at all: X509_USER_PROXY names a file that does not exist
    return site.backend(
        auth="token",
        env={"BEARER_TOKEN_FILE": str(token_file), "X509_USER_PROXY": str(site.folder / "none")},
    )


def _put_token(path, text: str) -> None:
    """A token file as a site keeps one: readable by its owner only."""
    path.write_text(text, encoding="utf-8")
    path.chmod(0o600)


def _endpoint(backend) -> Endpoint:
    (endpoint,) = backend.backend_info().endpoints
    return endpoint


def test_a_pilot_is_submitted_followed_and_cleaned_with_a_token_only(
    arc, rest_site, witness
) -> None:
    site = rest_site(arc)
    token = site.folder / "bt"
    _put_token(token, arc.token())
    ce = witness(arc)
    before = set(ce.delegations())
    backend = _token_backend(site, token)
    assert backend.backend_info().credentials == ("token",)
    endpoint = _endpoint(backend)
    result = backend.gridgate_submit(endpoint=endpoint, request=SubmitRequest("arc"), timeout=60)
    assert result.ok, result
    (job,) = result.job_ids
    description = (arc.folder / "control" / f"job.{ce_id(job)}.description").read_text()
    assert "delegationid" not in description, "no delegation with a token"
    assert set(ce.delegations()) == before

    def done():
        polled = backend.gridgate_job_status(endpoint=endpoint, job_ids=[job], timeout=60)
        assert polled.ok, polled
        return polled.statuses[job].state == "done"

    assert until(done, timeout=180, pause=3)
    backend.gridgate_iteration_finished(summary=None)  # cleans what was recorded final
    assert until(lambda: ce.states([job]) == {ce_id(job): "None"}, timeout=90, pause=2)


def test_an_expired_token_sends_nothing_and_blames_no_ce(arc, rest_site) -> None:
    site = rest_site(arc)
    token = site.folder / "bt"
    _put_token(token, arc.token(start=time.time() - 7200, lifetime=3600))
    backend = _token_backend(site, token)
    result = backend.gridgate_submit(
        endpoint=_endpoint(backend), request=SubmitRequest("arc"), timeout=60
    )
    assert not result.ok and result.command is None, "nothing was sent"
    failure = backend.gridgate_classify_failure(endpoint=_endpoint(backend), result=result)
    assert (failure.kind, failure.local, failure.exclude) == ("credential", True, False), failure
    assert "Token expired" in result.message and str(token) in result.message


@pytest.mark.parametrize(
    "scope",
    ["compute.read compute.modify compute.cancel", "storage.read"],
    ids=["no-create", "other"],
)
def test_a_token_the_ces_authgroups_do_not_admit_is_auth(arc, rest_site, scope) -> None:
    site = rest_site(arc)
    token = site.folder / "bt"
    _put_token(token, arc.token(scope=scope))
    backend = _token_backend(site, token)
    result = backend.gridgate_submit(
        endpoint=_endpoint(backend), request=SubmitRequest("arc"), timeout=60
    )
    assert not result.ok and "HTTP 403" in result.command.stderr, result
    failure = backend.gridgate_classify_failure(endpoint=_endpoint(backend), result=result)
    assert failure.kind == "auth", failure


def test_a_token_with_the_cli_interface_is_a_config_error_naming_the_file_line_and_key(
    tmp_path,
) -> None:
    from gridgate.core.config import ConfigError, load_config

    site = tmp_path / "site.yaml"
    site.write_text(
        "director: {state_dir: " + str(tmp_path / "state") + "}\n"
        "backends:\n"
        "  arc:\n"
        "    endpoints: [https://ce.example.org/arex]\n"
        "    script: /p.sh\n"
        "    interface: cli\n"
        "    auth: token\n"
        "demand: {static: {arc: 1}}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as caught:
        load_config(site)
    [problem] = [p for p in caught.value.problems if "auth" in str(p)]
    assert (problem.file, problem.line) == (str(site), 7), problem
    assert problem.path[-1] == "auth" and "needs interface: rest" in problem.message
    with pytest.raises(ConfigError):
        section_for(ArcBackend, {"interface": "cli", "auth": "token"})


def _shared_folder(tmp_path):
    """A folder like /tmp: anyone may create names in it (mode 1777)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def test_a_token_found_through_a_link_in_a_shared_folder_is_never_sent(
    arc, rest_site, tmp_path
) -> None:
    # another local user links bt_u<uid> in /tmp to a private file of the director's user:
    # that file passes every check on the link's target, yet it is not the user's token
    site = rest_site(arc)
    secret = site.folder / "private"
    _put_token(secret, arc.token())
    link = _shared_folder(tmp_path) / "bt_u1000"
    link.symlink_to(secret)
    backend = _token_backend(site, link)
    result = backend.gridgate_submit(
        endpoint=_endpoint(backend), request=SubmitRequest("arc"), timeout=60
    )
    assert not result.ok and result.command is None, "nothing was sent"
    assert "symbolic link" in result.message, result.message
    failure = backend.gridgate_classify_failure(endpoint=_endpoint(backend), result=result)
    assert (failure.kind, failure.local) == ("credential", True), failure


def test_a_proxy_found_through_a_link_in_a_shared_folder_is_never_used(
    arc, rest_site, tmp_path
) -> None:
    site = rest_site(arc)
    link = _shared_folder(tmp_path) / "x509up_u1000"
    link.symlink_to(site.proxy)
    backend = site.backend(env={"X509_USER_PROXY": str(link)})
    result = backend.gridgate_submit(
        endpoint=_endpoint(backend), request=SubmitRequest("arc"), timeout=60
    )
    assert not result.ok and result.command is None, "nothing was sent"
    assert "symbolic link" in result.message, result.message
    failure = backend.gridgate_classify_failure(endpoint=_endpoint(backend), result=result)
    assert failure.kind == "credential", failure
    # the same proxy named where no one else can put a link is used
    direct = site.backend(env={"X509_USER_PROXY": str(site.proxy)})
    assert direct.gridgate_submit(
        endpoint=_endpoint(direct), request=SubmitRequest("arc"), timeout=60
    ).ok
    # a regular proxy file in the shared folder is used too, the TLS client loading a private
    # copy of the bytes checked (a link put there after the check is never loaded)
    link.unlink()
    link.write_bytes(site.proxy.read_bytes())
    link.chmod(0o600)
    shared = site.backend(env={"X509_USER_PROXY": str(link)})
    credential = shared._rest.credential()
    assert credential.cert_file != str(link) and not credential.problem, credential
    assert credential.cert_file.startswith(str(site.folder / "state"))
    assert shared.gridgate_submit(
        endpoint=_endpoint(shared), request=SubmitRequest("arc"), timeout=60
    ).ok
