"""No silent default at start: a `COMPACTD_` variable that is not a setting is named
with the closest one, the proxy's upstreams are shown (without credentials), a
DATABASE_URL that is not Postgres's or a bad model catalog file is one line, and
the help reads as plain text. Run as the real command, as a person meets it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import build_parser
from app.core.settings import Settings, redacted_url, unknown_variables
from app.engine.accounting.catalog import lookup
from app.serving.startup import StartupFacts, banner
from tests.e2e.server import free_port
from tests.ops.test_serve_startup import (
    ROOT,
    Terminal,
    _command,
    _env,
    _run,
    assert_one_clear_line,
    served_without_a_terminal,
)

TYPO = {
    "COMPACTD_PROXY_OPENAI_ULR": "http://127.0.0.1:9/v1",
    "COMPACTD_PROXY_ANTHROPIC_URL": "https://agent:pr0xy-s3cret@127.0.0.1:9/anthropic",
    # Read elsewhere (the clients, the examples, the benchmarks): not flagged.
    "COMPACTD_URL": "http://127.0.0.1:8080",
    "COMPACTD_API_KEY": "cmpd_x",
    "COMPACTD_BENCH_CPU_REQUESTS": "10",
}


# ------------------------------------------------------------------ DATABASE_URL


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("mysql://a:pw-s3cret@b/c", "got mysql://a:***@b/c"),
        ("mysql://a@b/c", "got mysql://a@b/c"),
        ("not a url", "got 'not a url'"),
    ],
)
def test_a_database_url_that_is_not_postgres_is_one_line(url: str, shown: str) -> None:
    serve = _run("--port", str(free_port()), DATABASE_URL=url)
    for done in (serve, _command("migrate", DATABASE_URL=url)):
        line = assert_one_clear_line(done)
        assert line == (
            f"compactd: DATABASE_URL must be a postgres:// or postgresql:// URL; {shown}"
        )
        assert "cannot find the database host" not in done.stderr
        assert "s3cret" not in done.stderr


# ----------------------------------------------------------------- model catalog


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("models.toml", '["x"]\ncontext_window = "big"\n', "'x': context_window must be"),
        ("models.toml", "[x\n", "is not valid TOML"),
        ("models.json", '{"x": {"context_window": 8192, "max_tokens": 1}}', "unknown field"),
        ("missing.toml", None, "cannot read the model catalog"),
    ],
)
def test_a_bad_model_catalog_is_one_line(
    tmp_path: Path, name: str, text: str | None, says: str
) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text, encoding="utf-8")
    done = _run("--port", str(free_port()), COMPACTD_MODEL_CATALOG=str(path))
    line = assert_one_clear_line(done)
    assert str(path) in line
    assert says in line


# ----------------------------------------------------- unknown variables, the proxy


async def test_the_start_up_line_names_typos_and_the_proxy_upstreams(db_url: str) -> None:
    text = await served_without_a_terminal(free_port(), _env(DATABASE_URL=db_url, **TYPO))
    records = [json.loads(line) for line in text.splitlines()]
    warnings = [r["msg"] for r in records if r["level"] == "warning"]
    assert warnings == [
        "COMPACTD_PROXY_OPENAI_ULR is not a setting and is ignored: "
        "did you mean COMPACTD_PROXY_OPENAI_URL?"
    ], records
    [serving] = [r for r in records if r["msg"] == "serving"]
    assert serving["proxy_openai_url"] == "https://api.openai.com/v1"  # the typo's is unused
    assert serving["proxy_anthropic_url"] == "https://***@127.0.0.1:9/anthropic"
    assert "pr0xy-s3cret" not in text
    assert "agent:" not in text


def test_the_banner_names_typos_and_the_proxy_upstreams(db_url: str) -> None:
    port = free_port()
    terminal = Terminal("--port", str(port), DATABASE_URL=db_url, **TYPO)
    try:
        text = terminal.read_until(lambda t: "Press Ctrl-C to stop." in t)
    finally:
        terminal.close()
    print(text)
    assert "Press Ctrl-C to stop." in text
    assert (
        "proxy       openai -> https://api.openai.com/v1, "
        "anthropic -> https://***@127.0.0.1:9/anthropic"
    ) in text
    assert (
        "warning     COMPACTD_PROXY_OPENAI_ULR is not a setting and is ignored: "
        "did you mean COMPACTD_PROXY_OPENAI_URL?"
    ) in text
    assert "pr0xy-s3cret" not in text
    assert "COMPACTD_URL" not in text
    assert "COMPACTD_BENCH" not in text


def test_unknown_variables_and_their_closest_settings() -> None:
    environ = {
        **TYPO,
        "COMPACTD_PORT": "1",
        "DATABASE_URL": "postgresql://x/y",
        "COMPACTD_DATABASE_URL": "postgresql://x/y",
        "compactd_db_pool_sise": "3",
        "COMPACTD_NOTHING_LIKE_IT": "1",
        "COMPACTD_SESSION": "s",
        "PATH": "/bin",
    }
    assert unknown_variables(environ) == [
        ("COMPACTD_NOTHING_LIKE_IT", None),
        ("COMPACTD_PROXY_OPENAI_ULR", "COMPACTD_PROXY_OPENAI_URL"),
        ("compactd_db_pool_sise", "COMPACTD_DB_POOL_SIZE"),
    ]


def test_the_banner_rows() -> None:
    facts = StartupFacts(
        "1",
        "127.0.0.1",
        9000,
        "d",
        "m",
        keyed=False,
        loopback=True,
        proxy=(("openai", "http://o/v1"), ("anthropic", "http://a")),
        warnings=("W",),
    )
    text = banner(facts)
    assert "  proxy       openai -> http://o/v1, anthropic -> http://a\n" in text
    assert "  warning     W\n" in text
    assert redacted_url("https://u:p@h:1/v1?api_key=k&x=1", keep_user=False) == (
        "https://***@h:1/v1?api_key=***&x=1"
    )
    assert redacted_url("postgresql://u:p@h/db") == "postgresql://u:***@h/db"


# -------------------------------------------------------------------------- help


def _parsers() -> list[tuple[str, str]]:
    """Every command's and subcommand's help, as `--help` prints it."""
    found = []
    pending = [("compactd", build_parser())]
    while pending:
        name, parser = pending.pop()
        found.append((name, parser.format_help()))
        for action in parser._actions:
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):
                pending += [(f"{name} {sub}", child) for sub, child in choices.items()]
    return found


def test_the_help_reads_as_plain_text() -> None:
    helps = _parsers()
    assert {name for name, _ in helps} >= {"compactd", "compactd serve", "compactd keys revoke"}
    for name, text in helps:
        assert "`" not in text, f"{name} --help:\n{text}"
    top = dict(helps)["compactd"]
    assert "The compactd command" in top
    assert "Run the HTTP API" in dict(helps)["compactd serve"]
    done = _command("--help")
    assert done.returncode == 0
    assert "`" not in done.stdout


def test_the_documented_catalog_example_reads(tmp_path: Path) -> None:
    """The TOML example of docs/configuration.md is a catalog the settings accept."""
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    example = text.split("### The model catalog", 1)[1].split("```toml\n", 1)[1].split("```")[0]
    path = tmp_path / "models.toml"
    path.write_text(example, encoding="utf-8")
    catalog = Settings(model_catalog=path).catalog
    assert [o.prefix for o in catalog.overrides] == ["my-local-8k", "gpt-4o"]
    assert lookup("my-local-8k", catalog).context_window == 8192
