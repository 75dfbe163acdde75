"""Running the real agent CLIs, unmodified, against a model on loopback only.

Each run gets a home of its own (a temporary folder: the agent's settings, sessions and
caches live there), a working directory, and an environment built from nothing but
``PATH`` and the locale: no key or setting of the machine's reaches the agent. Every
proxy variable points at a loopback port that is bound but never listens (a connection
to it is refused at once), with ``NO_PROXY`` for loopback only, and the agents'
telemetry, error reporting and update checks are switched off: the model calls, on
loopback, are the only traffic that goes anywhere.

How each agent is pointed at a base URL with the ``X-Compactd-Session`` header is in
its ``prepare`` function; ``run`` starts it and waits.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.agents.install import CLAUDE, CODEX, OPENCODE, Agent

#: The key each agent sends; the scripted upstream and the checks expect it.
PROVIDER_KEY = "sk-test-provider-secret-7f3a9c1d2e"
SESSION_HEADER = "X-Compactd-Session"

# Model names the agents ask for: ones compactd's catalog knows, so that the session's
# window is the model's (a test that wants compactions makes the window small itself).
CODEX_MODEL = "gpt-5-codex"
OPENCODE_MODEL = "gpt-4o"


@dataclass(frozen=True, slots=True)
class Run:
    """One finished agent process."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        return (
            f"{' '.join(self.argv[:3])}... exited {self.returncode} after {self.seconds:.1f} s\n"
            f"--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-6000:]}"
        )


@contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound (no one else can take it) and
    never listening, for as long as the block runs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]
    finally:
        sock.close()


def offline_env(home: Path, dead_port: int) -> dict[str, str]:
    """The environment every agent starts from: a home of its own, every proxy a closed
    loopback port, loopback exempt, telemetry and update checks off."""
    proxy = f"http://127.0.0.1:{dead_port}"
    no_proxy = "127.0.0.1,localhost,::1"
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "TMPDIR": str(home / "tmp"),
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "true",
        "DO_NOT_TRACK": "1",
        "NO_UPDATE_NOTIFIER": "1",
    }
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = proxy
    env["NO_PROXY"] = env["no_proxy"] = no_proxy
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return env


@dataclass(frozen=True, slots=True)
class Prepared:
    argv: list[str]
    env: dict[str, str]


def prepare_claude(
    base_url: str, session: str, task: str, env: dict[str, str], *, resume: bool = False
) -> Prepared:
    """Claude Code: ``ANTHROPIC_BASE_URL`` (compactd's ``/proxy/anthropic``), a dummy
    key, the session header through ``ANTHROPIC_CUSTOM_HEADERS``; print mode with its
    tools allowed (as root that also takes ``IS_SANDBOX=1``)."""
    env = {
        **env,
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": PROVIDER_KEY,
        "ANTHROPIC_CUSTOM_HEADERS": f"{SESSION_HEADER}: {session}",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_BUG_COMMAND": "1",
        "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    }
    if os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"
    argv = [str(CLAUDE.executable), "-p", task, "--dangerously-skip-permissions"]
    if resume:
        argv.append("-c")
    return Prepared(argv, env)


def codex_config(base_url: str) -> str:
    """Codex's ``config.toml``: a provider on ``base_url`` speaking the Responses API,
    its key and the session header from the environment, and nothing that phones home."""
    return f"""\
model = "{CODEX_MODEL}"
model_provider = "compactd"
check_for_update_on_startup = false

[model_providers.compactd]
name = "compactd"
base_url = "{base_url}"
wire_api = "responses"
env_key = "COMPACTD_TEST_OPENAI_KEY"
env_http_headers = {{ "{SESSION_HEADER}" = "COMPACTD_SESSION" }}
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
"""


def prepare_codex(
    base_url: str, session: str, task: str, env: dict[str, str], *, resume: bool = False
) -> Prepared:
    """Codex: a ``CODEX_HOME`` whose provider is ``base_url`` (compactd's
    ``/proxy/openai/v1``); ``codex exec`` with approvals and its sandbox off (the test
    gives it a working directory of its own); ``exec resume --last`` to resume."""
    codex_home = Path(env["HOME"]) / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url))
    env = {
        **env,
        "CODEX_HOME": str(codex_home),
        "COMPACTD_TEST_OPENAI_KEY": PROVIDER_KEY,
        "COMPACTD_SESSION": session,
    }
    argv = [str(CODEX.executable), "exec", "--skip-git-repo-check"]
    argv.append("--dangerously-bypass-approvals-and-sandbox")
    if resume:
        argv += ["resume", "--last"]
    argv.append(task)
    return Prepared(argv, env)


def opencode_config(base_url: str, session: str) -> dict[str, object]:
    """OpenCode's ``opencode.json``: one provider through its bundled
    ``@ai-sdk/openai-compatible`` on ``base_url`` with the session header, its model the
    main and the small one, no autoupdate, no sharing, every tool allowed."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": f"compactd/{OPENCODE_MODEL}",
        "small_model": f"compactd/{OPENCODE_MODEL}",
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
        "provider": {
            "compactd": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "compactd",
                "options": {
                    "baseURL": base_url,
                    "apiKey": PROVIDER_KEY,
                    "headers": {SESSION_HEADER: session},
                },
                "models": {OPENCODE_MODEL: {"name": OPENCODE_MODEL}},
            }
        },
    }


def prepare_opencode(
    base_url: str, session: str, task: str, env: dict[str, str], *, resume: bool = False
) -> Prepared:
    """OpenCode: ``OPENCODE_CONFIG`` naming the config above, its switches for model
    lists, downloads and plugins off; ``opencode run``."""
    config = Path(env["HOME"]) / "opencode.json"
    config.write_text(json.dumps(opencode_config(base_url, session), indent=2))
    env = {
        **env,
        "OPENCODE_CONFIG": str(config),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_TERMINAL_TITLE": "1",
    }
    argv = [str(OPENCODE.executable), "run", *OPENCODE_DEBUG]
    if resume:
        argv.append("--continue")
    argv.append(task)
    return Prepared(argv, env)


# COMPACTD_AGENT_LOGS=1: OpenCode prints its logs to stderr (which a failing test shows).
OPENCODE_DEBUG = ["--print-logs"] if os.environ.get("COMPACTD_AGENT_LOGS") else []
PREPARE = {"claude": prepare_claude, "codex": prepare_codex, "opencode": prepare_opencode}


def run(
    agent: Agent,
    *,
    base_url: str,
    session: str,
    task: str,
    home: Path,
    workdir: Path,
    dead_port: int,
    resume: bool = False,
    timeout: float = 90,
) -> Run:
    """Run ``agent`` on ``task`` in ``workdir`` until it exits (killed after
    ``timeout`` seconds, which a test then reports as a failure)."""
    prepared = PREPARE[agent.name](
        base_url, session, task, offline_env(home, dead_port), resume=resume
    )
    return execute(prepared, workdir, timeout)


def execute(prepared: Prepared, workdir: Path, timeout: float = 90) -> Run:
    """Run a prepared agent command in ``workdir`` until it exits (killed after
    ``timeout`` seconds)."""
    started = time.monotonic()
    # A session of its own, so that a timeout ends the agent and every process it
    # started (Codex's launcher runs the native binary, which runs the shell).
    process = subprocess.Popen(
        prepared.argv,
        cwd=workdir,
        env=prepared.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        err += f"\n[killed after {timeout} s]"
    return Run(prepared.argv, process.returncode, out, err, time.monotonic() - started)
