"""``sbatch_options`` and ``env`` cannot carry the options the backend writes itself, however
sbatch would spell them: abbreviated long options, bundled short ones, its input environment
variables (issue 21, item 12); partition names with a trailing newline (item 16)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gridgate.core.testing import build_plugin
from gridgate.plugins.slurm.backend import SlurmBackend

BIN = Path(sys.executable).parent

#: word -> the sbatch -v line that proves sbatch itself reads it as the owned option
ABBREVIATED = {
    "--arr=0-4": "array : 0-4",
    "--ar=0-4": "array : 0-4",
    "--part=long": "partition : long",
    "--parti=long": "partition : long",
    "--job=other": "job-name : other",
    "-Hpother": "partition : other",  # -H (hold) then -p other
    "-vHa0-3": "array : 0-3",
    "-HJname": "job-name : name",
}
#: refused too, though sbatch itself finds them ambiguous today (--cluster-constraint)
AMBIGUOUS = ["--clu=c9", "--par=x"]
ACCEPTED = [
    "--output=/dev/null",
    "--hold",
    "-o/tmp/pilot-p.out",
    "-Hv",
    "--account=atlas",
    "-Aproject-a",
]


def _validate(
    tmp_path: Path, options: list[str], env: dict[str, str] | None = None, partition: str = "debug"
) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site.yaml"
    env_line = f"    env: {env!r}\n" if env else ""
    site.write_text(
        "backends:\n  slurm:\n    partitions: [" + json.dumps(partition) + "]\n    script: /p.sh\n"
        f"    sbatch_options: {options!r}\n" + env_line + "demand:\n  static:\n    slurm: 1\n"
    )
    return subprocess.run(
        [str(BIN / "gridgate"), "config", "validate", str(site)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("word", sorted(ABBREVIATED) + AMBIGUOUS)
def test_abbreviated_and_bundled_owned_options_are_refused(word: str, tmp_path: Path) -> None:
    out = _validate(tmp_path, ["--hold", word])
    assert out.returncode == 2, out.stdout
    assert f"{tmp_path / 'site.yaml'}:5: backends.slurm.sbatch_options[1]:" in out.stderr
    assert "is written by the backend" in out.stderr and f"sbatch reads {word!r} as" in out.stderr


def test_sbatch_itself_reads_the_refused_words_as_the_owned_options(tmp_path: Path) -> None:
    """The real sbatch, asked to print what it parsed (-v), before it fails to reach a
    controller that is not there: each refused word is what the refusal says it is.

    MessageTimeout=1 has sbatch give up on the port nobody listens on at once, not after
    Slurm's default 9 s of retries per word (what it printed before that is the same)."""
    sbatch = shutil.which("sbatch")
    assert sbatch, "the Slurm tests need sbatch (slurm-client)"
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=nowhere\nSlurmctldHost=localhost\nSlurmctldPort=1\nMessageTimeout=1\n"
        "NodeName=n1\nPartitionName=batch Nodes=n1\n"
    )
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for word, parsed in ABBREVIATED.items():
        out = subprocess.run(
            [sbatch, "-v", word, str(script)], capture_output=True, text=True, timeout=30, env=env
        )
        lines = {
            re.sub(r"\s+", " ", line.removeprefix("sbatch: ").strip())
            for line in out.stderr.splitlines()
        }
        assert parsed in lines, (word, out.stderr[-2000:])
    out = subprocess.run(
        [sbatch, "-v", str(script)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**env, "SBATCH_ARRAY_INX": "0-3"},
    )
    assert "array : 0-3" in {
        re.sub(r"\s+", " ", x.removeprefix("sbatch: ").strip()) for x in out.stderr.splitlines()
    }


def test_options_that_are_not_the_backends_are_accepted(tmp_path: Path) -> None:
    out = _validate(tmp_path, ACCEPTED)
    assert out.returncode == 0, out.stderr


def test_a_double_dash_is_refused(tmp_path: Path) -> None:
    # ["--", "/other.sh"] would make /other.sh the script and the pilot one of its arguments
    out = _validate(tmp_path, ["--", "/other.sh"])
    assert out.returncode == 2 and "sbatch_options[0]: -- is written by the backend" in out.stderr


@pytest.mark.parametrize("name", ["SBATCH_ARRAY_INX", "SBATCH_PARTITION", "SBATCH_JOB_NAME"])
def test_sbatch_input_variables_of_owned_options_are_refused_in_env(
    name: str, tmp_path: Path
) -> None:
    out = _validate(tmp_path, [], env={name: "0-4"})
    assert out.returncode == 2 and f"backends.slurm.env.{name}: {name} sets sbatch" in out.stderr


def test_the_directors_own_sbatch_array_variable_does_not_reach_sbatch(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("SBATCH_ARRAY_INX", "0-4")
    backend = build_plugin(SlurmBackend, {"partitions": ["debug"], "script": "/p.sh"})
    assert backend._environ is not None and "SBATCH_ARRAY_INX" not in backend._environ


def test_a_partition_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    out = _validate(tmp_path, [], partition="batch\n")
    assert out.returncode == 2 and "is not a Slurm partition" in out.stderr
