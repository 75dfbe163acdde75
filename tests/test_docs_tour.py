"""The tour of docs/api.md ("Every step, with curl") runs as printed, against a real
compactd (uvicorn, a fresh database, its compaction worker, no upstream LLM: as a
fresh ``make run``), and answers what the document says it answers.

The document's convention (stated in its tour's introduction):

- a ``sh`` block followed at once by a ``json`` or ``text`` block is a command and its
  output; the ``sh`` block runs whole in bash (``localhost:8080`` becomes the test
  server's address), each ``curl`` answer on a line of its own;
- in the output block, a line that starts with a space continues the line above (the
  answers are one line each; the document wraps them);
- ``…`` stands for text left out: anything the server answered there, including what
  varies from run to run (ids, times). Everything else must be exactly what the server
  answered.
"""

from __future__ import annotations

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

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
SECTION = "## Every step, with curl"
ELLIPSIS = "…"

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="the tour uses curl")


@dataclass(frozen=True)
class Step:
    line: int  # of the command block, in the document
    command: str
    expected: list[str]  # the output's lines, continuations joined


def tour_steps(text: str) -> list[Step]:
    """The command and output blocks of the tour, in order (see the module docstring)."""
    lines = text[text.index(SECTION) :].splitlines()
    offset = text[: text.index(SECTION)].count("\n") + 1
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
    for (start, kind, body), following in zip(blocks, [*blocks[1:], None], strict=True):
        if kind != "sh":
            continue
        assert following is not None, f"docs/api.md:{offset + start}: a command without output"
        next_start, next_kind, output = following
        assert next_kind in ("json", "text"), f"docs/api.md:{offset + start}: no output block"
        assert next_start == start + len(body) + 2, f"docs/api.md:{offset + start}: not adjacent"
        steps.append(Step(offset + start, "\n".join(body), _logical_lines(output)))
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
        }
    )


@pytest.fixture
def base_url(db_url: str) -> Iterator[str]:
    with running(create_app(tour_settings(), database_url=db_url)) as base:
        yield base


# Each curl's answer on a line of its own, as the document prints them.
PRELUDE = 'set -euo pipefail\ncurl() { command curl --max-time 60 "$@"; echo; }\n'


def test_the_tour_answers_what_the_document_says(base_url: str) -> None:
    steps = tour_steps(DOC.read_text(encoding="utf-8"))
    host = base_url.removeprefix("http://")
    failures = []
    for step in steps:
        script = PRELUDE + step.command.replace("localhost:8080", host)
        done = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, f"docs/api.md:{step.line}: {done.stderr}"
        actual = done.stdout.rstrip("\n").split("\n")
        if len(actual) != len(step.expected) or not all(
            matches(e, a) for e, a in zip(step.expected, actual, strict=True)
        ):
            failures.append(
                f"docs/api.md:{step.line}:\n  expected:\n    "
                + "\n    ".join(step.expected)
                + "\n  answered:\n    "
                + "\n    ".join(actual)
            )
    assert not failures, "the tour's outputs differ from the server's:\n" + "\n".join(failures)
