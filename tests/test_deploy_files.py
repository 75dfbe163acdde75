"""The deploy files and the docs (README.md, docs/*.md) stay in step with the code.

Every ``COMPACTD_*`` variable that Dockerfile, docker-compose.yml, deploy/*.yaml,
README.md or docs/*.md names is one the settings read; every setting is in the settings
table of docs/configuration.md with its real default; every ``compactd`` command line
those files run or show parses with the real argument parser; and the open-mode rules
hold (no keys only behind a loopback address). No Docker engine, no database: it reads
files.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from pydantic import AliasChoices

from app.cli import build_parser
from app.core.settings import OTHER_PREFIXES, OTHER_VARIABLES, PROJECT_ROOT, Settings

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
CONFIGURATION = ROOT / "docs" / "configuration.md"
K8S = sorted((ROOT / "deploy").glob("*.yaml"))
DOCUMENTS = [DOCKERFILE, COMPOSE, README, *DOCS, *K8S]

# Not preceded by a name character, so an agent's own AGENT_COMPACTD_URL is not one.
ENV_NAME = re.compile(r"(?<![A-Za-z0-9_])COMPACTD_[A-Z0-9_]*")
IMAGE = "compactd"


def setting_env_names() -> dict[str, str]:
    """Every environment variable Settings reads, to its field name."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    names: dict[str, str] = {}
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            for choice in alias.choices:
                assert isinstance(choice, str)
                names[choice.upper()] = field
        elif isinstance(alias, str):
            names[alias.upper()] = field
        else:
            names[(prefix + field).upper()] = field
    return names


SETTINGS = setting_env_names()


def _read_elsewhere(name: str) -> bool:
    """A variable the clients, examples, benchmarks or agent tier read (not a setting)."""
    return name in OTHER_VARIABLES or name.startswith(OTHER_PREFIXES)


def parses(argv: list[str], where: str) -> None:
    """``compactd <argv>`` is a valid command line."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `compactd {shlex.join(argv)}` does not parse")
    assert callable(args.func)


def compiles(code: str, where: str) -> None:
    """A ``python -c`` probe is valid Python."""
    try:
        compile(code, where, "exec")
    except SyntaxError as exc:
        pytest.fail(f"{where}: the probe is not valid Python: {exc}")


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return doc


def compactd_services() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, service in compose()["services"].items():
        if str(service.get("image", "")).split(":")[0] == IMAGE:
            yield name, service


def k8s_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in K8S:
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                yield path.name, doc


def k8s_containers() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(where, pod spec, container) for every container of the compactd image."""
    for name, doc in k8s_documents():
        pod = doc["spec"]["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            if str(container["image"]).split(":")[0] == IMAGE:
                yield f"{name}: {container['name']}", pod, container


def k8s_argv(container: dict[str, Any], where: str) -> list[str]:
    """The image's entrypoint is `compactd`; `command` may repeat it explicitly."""
    command = [str(c) for c in container.get("command", [])]
    args = [str(a) for a in container.get("args", [])]
    if command:
        assert command[0] == "compactd", f"{where}: command {command} does not run compactd"
        return command[1:] + args
    return args


def k8s_env(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


# ---------------------------------------------------------------------- settings


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.name)
def test_every_compactd_variable_named_is_a_setting(path: Path) -> None:
    unknown = set()
    for name in ENV_NAME.findall(path.read_text(encoding="utf-8")):
        if name.endswith("_"):  # a family, as in `COMPACTD_UPSTREAM_*`
            if not any(s.startswith(name) for s in SETTINGS):
                unknown.add(name + "*")
        elif name not in SETTINGS and not _read_elsewhere(name):
            unknown.add(name)
    assert not unknown, f"{path.name} names variables no setting reads: {sorted(unknown)}"


def settings_table() -> dict[str, str]:
    """Env name -> the default cell, from the `| `NAME` | default | what |` rows of
    docs/configuration.md's "Server settings"."""
    rows: dict[str, str] = {}
    section = CONFIGURATION.read_text(encoding="utf-8").split("\n## Server settings", 1)[1]
    section = section.split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0]):
            rows[name] = cells[1]
    return rows


def rendered_default(field: str) -> str:
    """A setting's default as the settings table writes it."""
    value = Settings.model_fields[field].default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Path):
        return (
            f"`{value.relative_to(PROJECT_ROOT)}`"
            if value.is_relative_to(PROJECT_ROOT)
            else f"`{value}`"
        )
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


def test_every_setting_is_in_the_settings_table_with_its_default() -> None:
    table = settings_table()
    missing = sorted(set(SETTINGS) - set(table))
    assert not missing, f"docs/configuration.md's settings table lacks {missing}"
    for name, field in SETTINGS.items():
        default = rendered_default(field)
        assert table[name].startswith(default), (
            f"docs/configuration.md gives {name} the default {table[name]!r}; the code's "
            f"is {default}"
        )


def test_the_dockerfile_env_points_the_writable_paths_at_writable_places() -> None:
    env = dict(re.findall(r"(COMPACTD_[A-Z_]+)=(\S+)", DOCKERFILE.read_text(encoding="utf-8")))
    assert env["COMPACTD_TIKTOKEN_CACHE_DIR"].startswith("/tmp/")  # an emptyDir in k8s
    assert env["COMPACTD_HOST"] == "0.0.0.0"  # reachable through a published port


# ---------------------------------------------------------------------- commands


def test_the_dockerfile_runs_compactd_commands_that_parse() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    entrypoint = json.loads(re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.M)[-1])
    cmd = json.loads(re.findall(r"^CMD (\[.*\])$", text, re.M)[-1])
    assert entrypoint == ["compactd"]
    parses(cmd, "Dockerfile CMD")
    joined = text.replace("\\\n", " ")  # continuation lines
    healthcheck = re.search(r"^HEALTHCHECK .* CMD (\[.*\])$", joined, re.M)
    assert healthcheck is not None
    probe = json.loads(healthcheck.group(1))
    assert probe[:2] == ["python", "-c"]
    compiles(probe[2], "Dockerfile HEALTHCHECK")


def test_every_compose_command_parses() -> None:
    services = dict(compactd_services())
    assert {"migrate", "api", "worker"} <= set(services)
    for name, service in services.items():
        parses([str(a) for a in service["command"]], f"docker-compose.yml {name}")
        test = service.get("healthcheck", {}).get("test")
        if test:
            assert test[:3] == ["CMD", "python", "-c"], f"{name}: {test}"
            compiles(test[3], f"docker-compose.yml {name} healthcheck")


def test_every_kubernetes_command_and_probe_is_valid() -> None:
    seen = 0
    for where, _pod, container in k8s_containers():
        seen += 1
        parses(k8s_argv(container, where), where)
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            command = container.get(probe, {}).get("exec", {}).get("command")
            if command:
                assert command[:2] == ["python", "-c"], f"{where} {probe}: {command}"
                compiles(command[2], f"{where} {probe}")
    assert seen >= 3


COMMANDS = "serve|worker|migrate|keys|openapi"
INVOCATIONS = [
    re.compile(rf"(?:^|[\s;&|(`])(?:\S*/)?compactd +((?:{COMMANDS})\b[^\n;&|#`)\\]*)", re.M),
    re.compile(rf"compactd:latest +((?:{COMMANDS})\b[^\n;&|#`)\\]*)"),
    re.compile(rf"docker compose run --rm \w+ +((?:{COMMANDS})\b[^\n;&|#`)\\]*)"),
]


def code_in(path: Path) -> str:
    """A Markdown file's code (fenced blocks and inline spans); other files whole."""
    text = re.sub(r"\$\([^)]*\)", "VALUE", path.read_text(encoding="utf-8"))  # "$(cat f)"
    if path.suffix != ".md":
        return text
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))
    return "\n".join([*blocks, *spans])


def documented_commands() -> Iterator[tuple[str, list[str]]]:
    """The argv of every compactd command shown in the code of README.md and docs/*.md
    and in the deploy files: `compactd ...`, `docker run ... compactd:latest ...`,
    `docker compose run --rm migrate ...`. Placeholders like NAME parse too."""
    for path in (README, *DOCS, DOCKERFILE, COMPOSE, *K8S):
        for pattern in INVOCATIONS:
            for match in pattern.finditer(code_in(path)):
                line = re.sub(r"\[[^]]*\]", "", match.group(1))  # `[--host H]`: optional
                argv = shlex.split(line.replace("…", "x"))
                for end, word in enumerate(argv):
                    if word[0] in "<>" or word[:2] == "2>":  # a redirection ends it
                        argv = argv[:end]
                        break
                yield path.name, argv


def test_every_compactd_command_the_docs_show_parses() -> None:
    commands = list(documented_commands())
    assert any(argv[:2] == ["keys", "create"] for _, argv in commands)
    for where, argv in commands:
        if len(argv) > 1:  # a lone word names a command (`compactd keys`) in prose
            parses(argv, where)


# ------------------------------------------------------------------ open mode


def test_compose_serves_open_mode_on_the_hosts_loopback_only() -> None:
    services = dict(compactd_services())
    for name, service in services.items():
        env = service.get("environment", {})
        if str(env.get("COMPACTD_INSECURE_NO_AUTH", "")).lower() == "true":
            for port in service.get("ports", []):
                assert str(port).startswith("127.0.0.1:"), (
                    f"{name}: open mode published beyond the host's loopback: {port}"
                )
    api = services["api"]
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["restart"] == "no"
    postgres = compose()["services"]["postgres"]
    assert postgres["healthcheck"]["test"]
    assert postgres["volumes"]


def test_kubernetes_serve_on_loopback_probes_from_inside() -> None:
    """The kubelet probes from the node: an httpGet probe never reaches 127.0.0.1."""
    for where, pod, container in k8s_containers():
        assert pod.get("enableServiceLinks") is False, f"{where}: COMPACTD_PORT would be set"
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert pod["securityContext"]["runAsNonRoot"] is True
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert "/tmp" in mounts, f"{where}: the tiktoken cache needs a writable /tmp"
        assert container["resources"]["limits"]["memory"]
        if k8s_argv(container, where)[:1] != ["serve"]:
            continue
        host = k8s_env(container).get("COMPACTD_HOST")
        assert host == "127.0.0.1", f"{where}: serve leaves loopback, which needs API keys"
        for probe in ("readinessProbe", "livenessProbe"):
            assert "exec" in container[probe], f"{where} {probe}: must run inside the pod"


# ------------------------------------------------------------------------ links


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file."""
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    anchors = set()
    for heading in re.findall(r"^#+ +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_the_docs_links_point_inside_the_repository(path: Path) -> None:
    """Every relative link of README.md and docs/*.md names a file of the repository (and
    a heading of it, with an anchor); nothing points outside it."""
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"\.\./shared\b", text)  # the workspace's folder, not the user's
    links = re.findall(r"\]\(([^)\s]+)\)", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S))
    assert links or path == README
    for link in links:
        if re.match(r"[a-z]+:", link):  # http(s):, mailto:
            continue
        target, _, anchor = link.partition("#")
        resolved = (path.parent / target).resolve() if target else path
        assert resolved.is_relative_to(ROOT), f"{path.name}: {link} is outside the repository"
        assert resolved.exists(), f"{path.name}: {link} names no file"
        if anchor:
            assert anchor in heading_anchors(resolved), f"{path.name}: {link}: no such heading"
