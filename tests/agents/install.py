"""The real coding agents the agent tier runs, pinned, and their installation from npm.

``python -m tests.agents.install`` (``make agents``) installs each pinned package with
``npm install --prefix <dir> --no-audit --no-fund`` into its own folder,
``$COMPACTD_AGENTS_DIR/<package>@<version>`` (by default
``~/.cache/compactd/agents``), and runs its ``--version``. A folder whose binary already
answers is left alone, so a second run does nothing. The agents' native binaries ship
inside the packages (as optional dependencies npm picks for this platform): once
installed, they run offline.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Agent:
    """One agent CLI: its npm package, the pinned version and the binary it installs."""

    name: str
    package: str
    version: str
    binary: str

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def folder(self) -> Path:
        return agents_dir() / self.spec

    @property
    def executable(self) -> Path:
        return self.folder / "node_modules" / ".bin" / self.binary


# Pinned: `npm view <package> version` when the tier was written. Bump deliberately, and
# run the tier: each release changes what its agent sends.
CLAUDE = Agent("claude", "@anthropic-ai/claude-code", "2.1.332", "claude")
CODEX = Agent("codex", "@openai/codex", "0.171.0", "codex")
OPENCODE = Agent("opencode", "opencode-ai", "1.18.33", "opencode")
AGENTS = (CLAUDE, CODEX, OPENCODE)

INSTALL_COMMAND = "make agents  (python -m tests.agents.install)"


def agents_dir() -> Path:
    configured = os.environ.get("COMPACTD_AGENTS_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "compactd" / "agents"


def version_of(agent: Agent, timeout: float = 60) -> str | None:
    """What ``<binary> --version`` prints, or None when it is missing or fails."""
    if not agent.executable.exists():
        return None
    try:
        done = subprocess.run(
            [str(agent.executable), "--version"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "DISABLE_AUTOUPDATER": "1", "NO_UPDATE_NOTIFIER": "1"},
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or done.stderr.strip()


def install(agent: Agent) -> str:
    """Install ``agent`` unless its binary already answers; returns its ``--version``."""
    found = version_of(agent)
    if found is not None:
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("npm is not installed: the agent tier needs Node.js and npm")
    folder = agent.folder
    # A folder left by a broken install is started again from scratch.
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    subprocess.run(
        [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", agent.spec],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    found = version_of(agent)
    if found is None:
        raise SystemExit(f"{agent.spec} installed, but {agent.executable} --version fails")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.agents.install",
        description="Install the pinned agent CLIs the agent test tier runs "
        "(into $COMPACTD_AGENTS_DIR, by default ~/.cache/compactd/agents).",
    )
    parser.add_argument("--check", action="store_true", help="only report; install nothing")
    args = parser.parse_args(argv)
    missing = 0
    for agent in AGENTS:
        if args.check:
            found = version_of(agent)
            missing += found is None
            print(f"{agent.spec}: {found or 'missing'}")
        else:
            print(f"{agent.spec}: {install(agent)}  ({agent.executable})", flush=True)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
