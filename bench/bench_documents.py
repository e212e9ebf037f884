"""The decode cost of an A-REX status answer (``POST jobs?action=status`` for N jobs, as A-REX
6.17 writes it: ``{"job":[{"status-code":"200","reason":"OK","id":...,"state":...}, ...]}``),
by three readers of the same answer into the values the REST path uses (code, reason, id,
state per job), timed in one process run, many repetitions each, and compared as ratios:

- **msgspec**: :func:`gridgate.plugins.arc.documents.job_answer`, the boundary in use (msgspec
  Structs through :func:`gridgate.core.documents.decode_json`: shape, types, the status code's
  form and the id's pattern checked while parsing, then the :class:`Entry` values);
- **json + hand checks**: ``json.loads`` (:func:`gridgate.core.text.parse_json`) and the checks
  the REST path made before issue 39 (a copy of that code is below: isinstance of the answer and
  of each entry, ``int()`` of the status code, ``str()`` of the rest; no id pattern);
- **pydantic**: a pydantic v2 ``TypeAdapter`` of the same shape and checks
  (``validate_json``), then the same values; skipped when pydantic is not installed (it is no
  dependency of gridgate: ``.venv/bin/pip install pydantic`` to include it).

    .venv/bin/python bench/bench_documents.py [--jobs 1000] [--repeat 15] [--number 20]

Reported: per reader, the best and the median of ``--repeat`` timings of ``--number`` decodes,
as microseconds per answer, and each reader's median over msgspec's.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import platform
import random
import statistics
import string
import sys
import timeit
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from gridgate.core.text import parse_json
from gridgate.plugins.arc.documents import CE_ID, job_answer

STATES = ("ACCEPTED", "PREPARING", "SUBMITTING", "QUEUING", "RUNNING", "FINISHED", "FAILED")


def status_answer(jobs: int, seed: int = 39) -> bytes:
    """A status answer for ``jobs`` jobs, ids of A-REX's length (54 characters)."""
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits
    entries = [
        {
            "status-code": "200",
            "reason": "OK",
            "id": "".join(rng.choice(alphabet) for _ in range(54)),
            "state": rng.choice(STATES),
        }
        for _ in range(jobs)
    ]
    return json.dumps({"job": entries}, separators=(",", ":")).encode()


# --- the hand checks the REST path made before issue 39 (rest/jobs.py:entries) ------------------


@dataclass(frozen=True)
class HandEntry:
    code: int
    reason: str
    id: str
    fields: Mapping[str, Any]


def hand_entries(body: bytes, key: str = "job") -> list[HandEntry]:
    if not body.strip():
        return []
    data = parse_json(body)
    if not isinstance(data, dict) or key not in data:
        raise ValueError(f"no {key!r} in the answer")
    items = data[key]
    items = items if isinstance(items, list) else [items]
    found: list[HandEntry] = []
    for item in items:
        if not isinstance(item, dict):
            raise ValueError(f"an entry of {key!r} is not an object")
        code = item.get("status-code", 200)
        try:
            number = int(code)
        except (TypeError, ValueError):
            raise ValueError(f"an entry's status-code {code!r} is not a number") from None
        found.append(HandEntry(number, str(item.get("reason", "")), str(item.get("id", "")), item))
    return found


def hand(body: bytes) -> list[tuple[int, str, str, str]]:
    # the poll then read each entry's state from the raw fields
    return [(e.code, e.reason, e.id, str(e.fields.get("state", ""))) for e in hand_entries(body)]


def typed(body: bytes) -> list[tuple[int, str, str, str]]:
    return [(e.code, e.reason, e.id, e.state) for e in job_answer(body)]


def pydantic_reader() -> Callable[[bytes], list[tuple[int, str, str, str]]] | None:
    try:  # no dependency of gridgate: imported by name, so type checks need it not
        pydantic: Any = importlib.import_module("pydantic")
    except ImportError:
        return None

    class PEntry(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(strict=True, populate_by_name=True)
        code: (
            Annotated[str, pydantic.StringConstraints(pattern=r"^[1-5][0-9][0-9]$")]
            | Annotated[int, pydantic.Field(ge=100, le=599)]
        ) = pydantic.Field(default="200", alias="status-code")
        reason: str = ""
        id: Annotated[str, pydantic.StringConstraints(pattern=CE_ID)] | None = None
        state: str = ""

    class PAnswer(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(strict=True)
        job: PEntry | list[PEntry]

    adapter = pydantic.TypeAdapter(PAnswer)

    def read(body: bytes) -> list[tuple[int, str, str, str]]:
        answer = adapter.validate_json(body)
        items = answer.job if isinstance(answer.job, list) else [answer.job]
        return [(int(i.code), i.reason, i.id or "", i.state) for i in items]

    read.version = pydantic.VERSION  # type: ignore[attr-defined]
    return read


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=20)
    args = parser.parse_args(argv)
    import msgspec

    body = status_answer(args.jobs)
    readers: dict[str, Callable[[bytes], list[tuple[int, str, str, str]]]] = {
        f"msgspec {msgspec.__version__} (documents.job_answer)": typed,
        "json.loads + hand checks (before issue 39)": hand,
    }
    pyd = pydantic_reader()
    if pyd is not None:
        readers[f"pydantic {pyd.version} TypeAdapter.validate_json"] = pyd  # type: ignore[attr-defined]
    expected = hand(body)
    for name, read in readers.items():
        assert read(body) == expected, name  # the same values from each
    # interleaved rounds, so that a slow moment of the machine falls on every reader alike
    times: dict[str, list[float]] = {name: [] for name in readers}
    for _round in range(args.repeat):
        for name, read in readers.items():
            seconds = timeit.timeit(functools.partial(read, body), number=args.number)
            times[name].append(seconds / args.number * 1e6)
    base = statistics.median(next(iter(times.values())))
    print(
        f"bench_documents {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, Python "
        f"{platform.python_version()} on {platform.machine()}, {sys.platform}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"A-REX status answer: {args.jobs} jobs, {len(body)} bytes; {args.repeat} rounds of "
        f"{args.number} decodes per reader, interleaved"
    )
    print(f"{'reader':<52} {'best us':>10} {'median us':>10} {'x msgspec':>10}")
    for name, found in times.items():
        median = statistics.median(found)
        print(f"{name:<52} {min(found):>10.0f} {median:>10.0f} {median / base:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
