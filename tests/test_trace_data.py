"""The real traces the tests and benchmarks replay are carried by the repository, with
their licence beside them: a fresh clone with nothing beside it has everything its tests
read, and a missing trace is a failure, never a skip."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from tests import traces

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "traces"


def test_the_23_traces_are_in_the_repository() -> None:
    files = traces.trace_files()
    assert len(files) == 23
    assert all(p.parent == DATA for p in files)
    for path in files:
        with gzip.open(path) as f:
            data = json.load(f)
        assert data["messages"], path.name
        assert traces.load(path), path.name


def test_the_traces_keep_their_licence_and_attribution() -> None:
    licence = (DATA / "LICENSE.md").read_text(encoding="utf-8")
    assert licence.startswith("MIT License")
    assert "Kilian A. Lieret and Carlos E. Jimenez" in licence
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    assert "SWE-agent/mini-swe-agent" in readme
    assert "MIT" in readme
    assert "[LICENSE.md](LICENSE.md)" in readme


def test_the_traces_are_test_data_not_in_the_image() -> None:
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert "tests" in ignored


def test_nothing_reads_a_folder_beside_the_repository() -> None:
    """No test, bench, app module or Makefile rule reads the shared folder beside the
    checkout it was written in (which a user of the repository does not have)."""
    # Spelled in pieces, so that this guard is not itself a line that names the folder.
    folder = "sha" + "red"
    outside = re.compile(rf"\.\./{folder}|{folder}/traces|parents\[2\] */ *\"{folder}\"")
    paths = [ROOT / "Makefile", *(ROOT / "app").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    paths += [p for p in (ROOT / "tests").rglob("*.py") if p != Path(__file__).resolve()]
    paths += list((ROOT / "docs").rglob("*.md"))
    offenders = [
        f"{p.relative_to(ROOT)}: {line.strip()}"
        for p in paths
        for line in p.read_text(encoding="utf-8").splitlines()
        if outside.search(line) and " not in " not in line  # a check that it is absent
    ]
    assert offenders == []
