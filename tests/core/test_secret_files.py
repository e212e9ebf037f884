"""Secret files are refused, as ssh refuses a private key, when others may read or change them."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from support.uids import AS_NOBODY

from gridgate.core.commands.app import cli
from gridgate.core.secrets import SecretError, read_secret

NOBODY = 65534


def _secret(folder: Path, mode: int, owner: int | None = None, name: str = "secret") -> Path:
    path = folder / name
    path.write_text("s3cret-value\n", encoding="utf-8")
    path.chmod(mode)
    if owner is not None:
        os.chown(path, owner, owner)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_a_file_others_may_access_is_refused_with_its_name_and_mode(tmp_path, mode):
    path = _secret(tmp_path, mode)
    with pytest.raises(SecretError) as info:
        read_secret({"file": str(path)})
    message = str(info.value)
    assert str(path) in message and f"{mode:04o}" in message, message
    assert "s3cret" not in message


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_file_is_read(tmp_path, mode):
    assert read_secret({"file": str(_secret(tmp_path, mode))}) == "s3cret-value"


def test_a_file_of_another_user_is_refused(tmp_path):
    # root reads it (root reads anything) but nobody's file may have been changed by nobody
    path = _secret(tmp_path, 0o600, owner=NOBODY)
    with pytest.raises(SecretError, match=f"belongs to uid {NOBODY}"):
        read_secret({"file": str(path)})


def test_as_an_ordinary_user_its_own_file_is_read_and_roots_loose_file_refused():
    folder = Path(tempfile.mkdtemp(prefix="ggsecret-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        own = _secret(folder, 0o600, owner=NOBODY, name="own")
        loose = _secret(folder, 0o644, name="loose")  # root's, world-readable
        code = (
            "import sys\n"
            "from gridgate.core.secrets import read_secret, SecretError\n"
            f"print(read_secret({{'file': {str(own)!r}}}))\n"
            f"try:\n    read_secret({{'file': {str(loose)!r}}})\n"
            "except SecretError as exc:\n    print('refused:', exc)\n"
        )
        out = subprocess.run(
            AS_NOBODY + [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert out.returncode == 0, out.stderr
        first, second = out.stdout.splitlines()
        assert first == "s3cret-value"
        assert second.startswith("refused:") and "0644" in second and str(loose) in second
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def _site(tmp_path: Path, where: str, secret: Path) -> Path:
    spec = {"file": str(secret)}
    # paused: a director config that submits nothing must say so (config_checks)
    doc: dict = {"director": {"paused": True}, "backends": {}, "notifiers": {"log": {}}}
    if where == "proxyd.key":
        doc["proxyd"] = {"tcp": "127.0.0.1:7000", "key": spec}
    elif where == "notifiers.email.password":
        doc["notifiers"]["email"] = {
            "host": "localhost",
            "from": "gg@example.org",
            "error_address": "ops@example.org",
            "username": "gridgate",
            "password": spec,
        }
    elif where == "notifiers.ggus.rest.token":
        doc["notifiers"]["ggus"] = {
            "vo": "lhcb",
            "deliver": ["rest"],
            "rest": {"url": "https://ggus.example.org", "token": spec},
        }
    elif where == "credentials.bearer_token.issuer.client_secret":
        doc["credentials"] = {
            "bearer_token": {
                "issuer": {
                    "url": "https://iam.example.org",
                    "client_id": "f",
                    "client_secret": spec,
                }
            }
        }
    elif where == "state.password":
        doc["state"] = {"driver": "redis", "url": "redis://localhost:6379/0", "password": spec}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


WHERE = [
    "proxyd.key",
    "notifiers.email.password",
    "notifiers.ggus.rest.token",
    "state.password",
    "credentials.bearer_token.issuer.client_secret",
]


@pytest.mark.parametrize("where", WHERE)
def test_config_validate_refuses_a_loose_secret_file(tmp_path, where):
    secret = _secret(tmp_path, 0o644)
    site = _site(tmp_path, where, secret)
    result = CliRunner().invoke(cli, ["config", "validate", str(site)])
    assert result.exit_code == 2, result.output
    assert f": {where}.file: secret file {secret} has mode 0644" in result.output, result.output
    secret.chmod(0o600)
    result = CliRunner().invoke(cli, ["config", "validate", str(site)])
    assert result.exit_code == 0, result.output


def test_serve_refuses_a_world_readable_key(gridgate_exe, tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="ggsecret-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        key = _secret(folder, 0o644, name="proxyd.key")
        config = folder / "proxyd.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "proxyd": {
                        "socket": str(folder / "proxyd.sock"),
                        "tcp": "127.0.0.1:0",
                        "key": {"file": str(key)},
                    }
                }
            ),
            encoding="utf-8",
        )
        # no validation in front of serve here: the daemon itself must refuse to read the key
        done = subprocess.run(
            [gridgate_exe, "lsfproxyd", "serve", "-c", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0
        assert f"{key}" in done.stderr and "0644" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert not (folder / "proxyd.sock").exists()
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)
