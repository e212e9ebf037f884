"""Where Grid Engine writes a pilot's stdout and stderr, worked out as qsub(1) does from the
options the backend gave qsub (``qsub_options``: ``-o``, ``-e``, ``-j y``, ``-wd``, ``-cwd``),
the job's name and its owner: a path (or a folder, in which ``NAME.oJOB[.TASK]`` goes) with
its pseudo variables ``$HOME``, ``$USER``, ``$JOB_ID``, ``$JOB_NAME`` and ``$TASK_ID``
expanded; without ``-o``, ``NAME.oJOB`` in the owner's home (or ``-wd``'s folder).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["OutputOptions", "output_options", "output_path"]


@dataclass(frozen=True)
class OutputOptions:
    """The qsub options that say where a job's output goes (the last of each wins, as qsub
    reads them)."""

    stdout: str | None = None
    stderr: str | None = None
    join: bool = False
    wd: str | None = None
    cwd: bool = False


def output_options(words: Sequence[str]) -> OutputOptions:
    """The output options of ``qsub_options`` (each option and its value are separate words)."""
    found: dict[str, str] = {}
    cwd = False
    index = 0
    while index < len(words):
        word = words[index]
        if word in ("-o", "-e", "-j", "-wd") and index + 1 < len(words):
            found[word] = words[index + 1]
            index += 2
            continue
        cwd = cwd or word == "-cwd"
        index += 1
    return OutputOptions(
        stdout=found.get("-o"),
        stderr=found.get("-e"),
        join=(found.get("-j") or "n").lower() in ("y", "yes"),
        wd=found.get("-wd"),
        cwd=cwd,
    )


def output_path(
    options: OutputOptions, stream: str, job_id: str, name: str, owner: str, home: str
) -> tuple[str, str]:
    """(the path of ``stream`` of job ``job_id``, '') or ('', why it cannot be told).

    :param options: the submission's output options.
    :param stream: ``stdout`` or ``stderr`` (into stdout's file with ``-j y``).
    :param job_id: ``NUMBER`` or ``NUMBER.TASK``.
    :param name: the job's name (``qstat -j``, ``qacct -j``).
    :param owner: the job's owner (its ``$USER``).
    :param home: the owner's home folder (its ``$HOME``).
    """
    number, _, task = job_id.partition(".")
    merged = stream == "stderr" and options.join
    letter = "o" if stream == "stdout" or merged else "e"
    template = options.stdout if letter == "o" else options.stderr
    default = f"{name}.{letter}{number}" + (f".{task}" if task else "")
    if options.wd is not None:
        base = options.wd
    elif options.cwd:
        return "", "-cwd: the folder qsub ran in is not known here"
    else:
        base = home
    if template is None:
        return os.path.join(base, default), ""
    if "," in template or ":" in template:
        return "", f"-{letter} {template!r} names hosts: not read here"
    if "$HOSTNAME" in template:
        return "", f"-{letter} {template!r} depends on the execution host: not read here"
    path = template
    for variable, value in (
        ("$JOB_NAME", name),
        ("$JOB_ID", number),
        ("$TASK_ID", task or "undefined"),
        ("$HOME", home),
        ("$USER", owner),
    ):
        path = path.replace(variable, value)
    path = os.path.join(base, path)  # an absolute path stays as it is
    if os.path.isdir(path):
        path = os.path.join(path, default)
    return path, ""
