"""The walk-throughs of the docs run as printed, in the order a newcomer meets them,
against one real compactd (uvicorn, a fresh database, its compaction worker, no
upstream LLM: as a fresh ``make run``), and answer what the documents say:
README.md's walk-through (session ``demo``), docs/security.md's (keys on, revoked, then
deleted: the service must be open again), then docs/api.md's tour (session ``tour``).

The documents' convention (stated in docs/api.md's tour):

- a ``sh`` block followed at once by a ``json`` or ``text`` block is a command and its
  output; the ``sh`` block runs whole in bash (``localhost:8080`` becomes the test
  server's address), each ``curl`` answer on a line of its own, with what the commands
  print on stderr (``keys create``'s line) shown as a terminal shows it;
- in the output block, a line that starts with a space continues the line above (the
  answers are one line each; the document wraps them);
- ``…`` stands for text left out: anything the server answered there, including what
  varies from run to run (ids, times). Everything else must be exactly what the server
  answered.

The security walk-through waits for the server's key cache (``sleep 5``,
COMPACTD_AUTH_CACHE_SECONDS); here the cache period is 0.5 s and the waits 1 s.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.core.settings import Settings
from app.main import create_app
from tests.conftest import TEST_SETTINGS
from tests.e2e.server import running

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "api.md"
SECTION = "## Every step, with curl"
ELLIPSIS = "…"

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="the tour uses curl")


@dataclass(frozen=True)
class Step:
    where: str  # the document and line of the command block
    command: str
    expected: list[str]  # the output's lines, continuations joined


def tour_steps(text: str, start: str = SECTION, *, doc: str = "docs/api.md") -> list[Step]:
    """The command and output blocks from ``start`` to the next ``## `` heading, in order
    (see the module docstring)."""
    begin = text.index(start)
    lines = text[begin:].splitlines()
    offset = text[:begin].count("\n") + 1
    ends = [n for n, line in enumerate(lines) if n and line.startswith("## ")]
    lines = lines[: ends[0]] if ends else lines
    blocks: list[tuple[int, str, list[str]]] = []
    i = 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w*)", lines[i])
        if fence is None:
            i += 1
            continue
        end = lines.index("```", i + 1)
        blocks.append((i, fence[1], lines[i + 1 : end]))
        i = end + 1
    steps = []
    for (first, kind, body), following in zip(blocks, [*blocks[1:], None], strict=True):
        if kind != "sh":
            continue
        where = f"{doc}:{offset + first}"
        assert following is not None, f"{where}: a command without output"
        next_first, next_kind, output = following
        assert next_kind in ("json", "text"), f"{where}: no output block after it"
        assert next_first == first + len(body) + 2, f"{where}: its output is not next to it"
        steps.append(Step(where, "\n".join(body), _logical_lines(output)))
    return steps


def _logical_lines(output: list[str]) -> list[str]:
    joined: list[str] = []
    for line in output:
        if line.startswith(" ") and joined:
            joined[-1] += line[1:]
        else:
            joined.append(line)
    return joined


def matches(expected: str, actual: str) -> bool:
    """``actual`` is ``expected`` with each ``…`` standing for any text (a glob with one
    wildcard: leftmost matching of each literal piece in turn is exact)."""
    pieces = expected.split(ELLIPSIS)
    if len(pieces) == 1:
        return expected == actual
    first, *middle, last = pieces
    if not actual.startswith(first) or len(actual) < len(first) + len(last):
        return False
    at = len(first)
    end = len(actual) - len(last)
    for piece in middle:
        found = actual.find(piece, at, end)
        if found < 0:
            return False
        at = found + len(piece)
    return actual.endswith(last)


def test_the_matcher_takes_ellipses_as_anything() -> None:
    assert matches('{"id":"…","n":1}', '{"id":"a-b","n":1}')
    assert matches("a…c…e", "abcde")
    assert matches("a…", "a")
    assert not matches("a…c", "abd")
    assert not matches('{"n":1}', '{"n":2}')
    assert not matches("ab…ba", "aba")  # the two ends may not overlap


def test_the_tour_has_its_own_session_and_every_command_its_output() -> None:
    text = DOC.read_text(encoding="utf-8")
    steps = tour_steps(text)
    assert len(steps) >= 9
    commands = "\n".join(s.command for s in steps)
    # The README's walk-through creates `demo`: the tour, run after it, must not clash.
    assert "/v1/sessions/demo" not in commands
    assert '"id": "demo"' not in commands
    assert ELLIPSIS in text[text.index(SECTION) :].split("```")[0], "the convention is stated"


def tour_settings() -> Settings:
    """As a fresh `make run`: its compaction worker, no upstream LLM (the extractive
    summarizer), default limits."""
    defaults = Settings.model_fields
    return TEST_SETTINGS.model_copy(
        update={
            "compaction_workers": defaults["compaction_workers"].default,
            "compaction_poll_seconds": 0.2,
            "max_body_bytes": defaults["max_body_bytes"].default,
            "upstream_base_url": None,
            "auth_cache_seconds": 0.5,
        }
    )


@pytest.fixture
def base_url(db_url: str) -> Iterator[str]:
    with running(create_app(tour_settings(), database_url=db_url)) as base:
        yield base


# Each curl's answer on a line of its own, as the document prints them.
PRELUDE = 'set -euo pipefail\ncurl() { command curl --max-time 60 "$@"; echo; }\n'


def walk_throughs() -> list[Step]:
    """README's, then security.md's, then the API tour's commands, in that order."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    security = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    return [
        *tour_steps(readme, "## A walk-through with curl", doc="README.md"),
        *tour_steps(security, "Turning keys on", doc="docs/security.md"),
        *tour_steps(DOC.read_text(encoding="utf-8")),
    ]


@pytest.mark.slow  # about 20 s: a server, four runs of the CLI, the key cache's waits
def test_the_walk_throughs_answer_what_the_documents_say(
    base_url: str, db_url: str, tmp_path: Path
) -> None:
    steps = walk_throughs()
    assert any("keys delete" in s.command for s in steps)
    host = base_url.removeprefix("http://")
    # The CLI reaches this test's database; `~/.compactd-key` is written in tmp_path.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTD_")}
    env |= {"DATABASE_URL": db_url, "HOME": str(tmp_path), "COMPACTD_LOG_LEVEL": "warning"}
    env.pop("PYTHONPATH", None)
    failures = []
    for step in steps:
        command = step.command.replace("localhost:8080", host).replace("sleep 5", "sleep 1")
        done = subprocess.run(
            ["bash", "-c", PRELUDE + command],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{step.where}: {done.stdout}"
        actual = done.stdout.rstrip("\n").split("\n")
        if len(actual) != len(step.expected) or not all(
            matches(e, a) for e, a in zip(step.expected, actual, strict=True)
        ):
            failures.append(
                f"{step.where}:\n  expected:\n    "
                + "\n    ".join(step.expected)
                + "\n  answered:\n    "
                + "\n    ".join(actual)
            )
    assert not failures, "the documents' outputs differ from the server's:\n" + "\n".join(failures)
