"""Usage reports: calibration, the hybrid estimate, and the verdict."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest

from app.engine.accounting.budget import (
    CALIBRATION_ALPHA,
    CALIBRATION_MAX,
    CALIBRATION_MIN,
    CALIBRATION_MIN_COUNTED,
)
from app.engine.accounting.tokens import REPLY_PRIMING_TOKENS
from tests.conftest import make_session
from tests.helpers import append_ok, assert_problem, get_session


async def usage(client: httpx.AsyncClient, session_id: str, **body: Any) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{session_id}/usage", json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def turn(k: int) -> list[dict[str, Any]]:
    """A user turn of about 1,200 tokens: on its own enough to calibrate against
    (CALIBRATION_MIN_COUNTED)."""
    return [{"role": "user", "content": f"Step {k}: " + "explain the failing test output. " * 200}]


async def test_usage_calibrates_and_sets_the_exact_base(client: httpx.AsyncClient) -> None:
    await make_session(client, id="u")
    appended = await append_ok(client, "u", turn(1))
    counted = appended["context_tokens"] + REPLY_PRIMING_TOKENS
    body = await usage(client, "u", input_tokens=2 * counted, output_tokens=50)
    # One report moves the factor a fifth of the way to the ratio (2.0).
    assert body["calibration_factor"] == pytest.approx(0.8 + 0.2 * 2.0)
    assert body["reported_prompt_tokens"] == 2 * counted
    assert body["overflow"]["estimated_tokens"] == 2 * counted  # exact right after a report
    assert body["version"] == appended["version"] + 1
    assert body["pruned"] is None

    # What is appended since is added from stored counts, calibrated.
    later = await append_ok(client, "u", turn(2))
    added = later["entries"][0]["tokens"]
    expected = 2 * counted + round(added * body["calibration_factor"])
    assert later["overflow"]["estimated_tokens"] == expected

    session = await get_session(client, "u")
    assert session["usage_count"] == 1
    assert session["calibration_factor"] == body["calibration_factor"]
    assert session["last_usage"]["input_tokens"] == 2 * counted
    assert session["last_usage"]["output_tokens"] == 50


async def test_cache_figures_count_toward_the_prompt(client: httpx.AsyncClient) -> None:
    await make_session(client, id="c")
    await append_ok(client, "c", turn(1))
    body = await usage(
        client, "c", input_tokens=100, cache_read_tokens=1000, cache_write_tokens=200
    )
    assert body["reported_prompt_tokens"] == 1300


async def test_tool_schemas_are_counted_as_overhead(client: httpx.AsyncClient) -> None:
    await make_session(client, id="t")
    await append_ok(client, "t", turn(1))
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "Run a shell command and return its output.",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                    "required": ["command"],
                },
            },
        }
    ]
    counted = await usage(client, "t", input_tokens=500, tools=tools)
    assert counted["overhead_tokens"] > 20
    given = await usage(client, "t", input_tokens=500, tools_tokens=321)
    assert given["overhead_tokens"] == 321
    kept = await usage(client, "t", input_tokens=500)
    assert kept["overhead_tokens"] == 321  # unchanged when not reported


async def test_calibration_converges_to_a_tokenizer_that_counts_more(
    client: httpx.AsyncClient,
) -> None:
    """A provider whose tokenizer counts 1.3x tiktoken: the calibrated estimate of
    the stored context comes within 5% of its reports within 10 reports, and the
    factor approaches 1.3 from below without overshooting."""
    await make_session(client, id="k")
    factors: list[float] = []
    within_at: int | None = None
    for k in range(1, 16):
        appended = await append_ok(client, "k", turn(k))
        counted = appended["context_tokens"] + REPLY_PRIMING_TOKENS
        actual = round(1.3 * counted)
        before = factors[-1] if factors else 1.0
        if within_at is None and abs(before * counted - actual) / actual <= 0.05:
            within_at = k - 1  # reports received before this call
        body = await usage(client, "k", input_tokens=actual)
        factors.append(body["calibration_factor"])
    assert within_at is not None
    assert within_at <= 10, factors
    assert all(a < b for a, b in itertools.pairwise(factors)), factors
    assert all(f <= 1.3 + 1e-6 for f in factors), factors


async def test_calibration_is_clamped(client: httpx.AsyncClient) -> None:
    await make_session(client, id="clamp")
    appended = await append_ok(client, "clamp", turn(1))
    counted = appended["context_tokens"] + REPLY_PRIMING_TOKENS
    # A provider counting 3.9x (plausible, beyond the bound): the factor climbs to
    # the bound and stops there; then 0.26x takes it down to the other bound.
    high = [await usage(client, "clamp", input_tokens=round(3.9 * counted)) for _ in range(60)]
    assert all(b["calibration_factor"] <= CALIBRATION_MAX for b in high)
    assert high[-1]["calibration_factor"] == pytest.approx(CALIBRATION_MAX, abs=1e-4)
    low = [await usage(client, "clamp", input_tokens=round(0.26 * counted)) for _ in range(60)]
    assert all(b["calibration_factor"] >= CALIBRATION_MIN for b in low)
    assert low[-1]["calibration_factor"] == pytest.approx(CALIBRATION_MIN, abs=1e-4)


async def test_one_odd_report_does_not_send_the_factor_to_its_clamp(
    client: httpx.AsyncClient,
) -> None:
    """A large prompt against a session whose counted tokens are tiny moved the
    factor from 1.0 straight to 3.0, tripling every estimate after it."""
    await make_session(client, id="odd")
    small = await append_ok(client, "odd", [{"role": "user", "content": "Hi."}])
    assert small["context_tokens"] < CALIBRATION_MIN_COUNTED
    body = await usage(client, "odd", input_tokens=6_000)  # an unstored system prompt, say
    assert body["calibration_factor"] == 1.0
    # The report is still the exact base of the estimate.
    assert body["overflow"]["estimated_tokens"] == 6_000
    later = await append_ok(client, "odd", turn(1))
    assert later["overflow"]["estimated_tokens"] == 6_000 + later["entries"][0]["tokens"]

    # Enough counted tokens and a ratio of 30x: clamped to 4x, one EMA step, not
    # the bound.
    big = await usage(
        client, "odd", input_tokens=30 * (later["context_tokens"] + REPLY_PRIMING_TOKENS)
    )
    assert big["calibration_factor"] == pytest.approx(1.0 + CALIBRATION_ALPHA * 3.0, abs=1e-3)
    assert (await get_session(client, "odd"))["calibration_factor"] == big["calibration_factor"]


async def test_a_persistent_ratio_walks_the_factor_to_its_clamp(
    client: httpx.AsyncClient,
) -> None:
    """Seed 002, through the API: 15 usage reports each at 3.5x, 4.1x, 10x and
    0.05x of the counted context. The factor is monotone in the ratio after every
    report and the persistent extremes reach the clamp (a report beyond 4x was
    ignored, so 4.1x and 10x left the factor at 1.0 for ever)."""
    ratios = (0.05, 3.5, 4.1, 10.0)
    counted: dict[float, int] = {}
    for ratio in ratios:
        session_id = f"ratio-{ratio}"
        await make_session(client, id=session_id)
        appended = await append_ok(client, session_id, turn(1))
        counted[ratio] = appended["context_tokens"] + REPLY_PRIMING_TOKENS
    walks: dict[float, list[float]] = {ratio: [] for ratio in ratios}
    for _ in range(15):
        for ratio in ratios:
            body = await usage(client, f"ratio-{ratio}", input_tokens=round(ratio * counted[ratio]))
            walks[ratio].append(body["calibration_factor"])
    for k in range(15):
        after = [walks[ratio][k] for ratio in sorted(ratios)]
        assert after == sorted(after), (k, walks)
    assert walks[4.1][-1] == CALIBRATION_MAX, walks
    assert walks[10.0][-1] == CALIBRATION_MAX, walks
    assert walks[0.05][-1] == CALIBRATION_MIN, walks
    assert walks[3.5][-1] == CALIBRATION_MAX, walks
    # One report moved the factor by one EMA step at most: the first 10x report
    # took it from 1.0 to 1.6 (the ratio clamped to 4x), not to the bound.
    assert walks[10.0][0] == pytest.approx(1.0 + CALIBRATION_ALPHA * 3.0, abs=1e-3)
    for ratio in ratios:
        session = await get_session(client, f"ratio-{ratio}")
        assert session["calibration_factor"] == walks[ratio][-1]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input_tokens": -1}, "input_tokens"),
        ({"input_tokens": 10, "output_tokens": -5}, "output_tokens"),
        ({"input_tokens": 10**12}, "input_tokens"),
        ({"input_tokens": 10, "cache_read_tokens": 10**9}, "cache_read_tokens"),
        ({"input_tokens": "many"}, "input_tokens"),
        ({"output_tokens": 3}, "input_tokens"),
        ({"input_tokens": 10, "prompt_tokens": 10}, "prompt_tokens"),
        ({"input_tokens": 10, "tools_tokens": -1}, "tools_tokens"),
        ({"input_tokens": 10, "tools": "bash"}, "tools"),
    ],
)
async def test_bad_usage_is_rejected_and_changes_nothing(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    await make_session(client, id="bad")
    await append_ok(client, "bad", turn(1))
    before = await get_session(client, "bad")
    r = await client.post("/v1/sessions/bad/usage", json=body)
    assert_problem(r, 422, field)
    after = await get_session(client, "bad")
    assert after == before


async def test_usage_on_a_missing_session_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/sessions/nope/usage", json={"input_tokens": 5})
    assert_problem(r, 404, "nope")


# --- bounds on sums, and the format ------------------------------------------------------

MAX = 100_000_000


@pytest.mark.parametrize(
    ("body", "field", "named"),
    [
        (
            {"input_tokens": MAX, "cache_read_tokens": MAX, "cache_write_tokens": MAX},
            "input_tokens",
            "input_tokens (100,000,000) + cache_read_tokens (100,000,000) + cache_write_tokens "
            "(100,000,000) is 300,000,000, the prompt",
        ),
        (
            {"input_tokens": 1, "cache_read_input_tokens": MAX, "service_tier": "standard"},
            "input_tokens",
            "input_tokens (1) + cache_read_input_tokens (100,000,000) is 100,000,001, the prompt",
        ),
        (
            {"type": "message", "usage": {"input_tokens": MAX, "cache_creation_input_tokens": 9}},
            "usage.input_tokens",
            "usage.cache_creation_input_tokens (9) is 100,000,009",
        ),
        (
            {
                "usageMetadata": {
                    "promptTokenCount": 9,
                    "candidatesTokenCount": MAX,
                    "thoughtsTokenCount": 1,
                }
            },
            "usageMetadata.candidatesTokenCount",
            "the output",
        ),
    ],
)
async def test_a_sum_of_figures_above_the_bound_is_a_422_naming_it(
    client: httpx.AsyncClient, body: dict[str, Any], field: str, named: str
) -> None:
    await make_session(client, id="sum")
    await append_ok(client, "sum", turn(1))
    before = await get_session(client, "sum")
    r = await client.post("/v1/sessions/sum/usage", json=body)
    doc = assert_problem(r, 422, field, named)
    assert doc["errors"][0]["field"] == field
    assert await get_session(client, "sum") == before


async def test_a_prompt_at_the_bound_is_taken(client: httpx.AsyncClient) -> None:
    await make_session(client, id="edge")
    await append_ok(client, "edge", turn(1))
    body = await usage(
        client, "edge", input_tokens=MAX - 2, cache_read_tokens=1, cache_write_tokens=1
    )
    assert body["reported_prompt_tokens"] == MAX


@pytest.mark.parametrize(
    ("query", "body", "field"),
    [
        ({"format": "bogus"}, {"input_tokens": 5}, "query.format"),
        ({"format": "gemini"}, {"promptTokenCount": 5}, "query.format"),
        ({}, {"input_tokens": 5, "format": "bogus"}, "format"),
        ({}, {"input_tokens": 5, "cache_read_input_tokens": 3, "format": "bogus"}, "format"),
        ({}, {"prompt_tokens": 5, "format": 7}, "format"),
        ({}, {"type": "message", "usage": {"input_tokens": 5}, "format": "OpenAI"}, "format"),
    ],
)
async def test_a_format_that_is_not_openai_or_anthropic_is_a_422_naming_the_choices(
    client: httpx.AsyncClient, query: dict[str, str], body: dict[str, Any], field: str
) -> None:
    await make_session(client, id="fmt")
    await append_ok(client, "fmt", turn(1))
    before = await get_session(client, "fmt")
    r = await client.post("/v1/sessions/fmt/usage", params=query, json=body)
    doc = assert_problem(r, 422, field, "'openai' or 'anthropic'")
    assert doc["errors"][0]["field"] == field
    assert await get_session(client, "fmt") == before


async def test_format_is_taken_as_on_every_route_and_both_must_agree(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="fmt")
    await append_ok(client, "fmt", turn(1))
    url = "/v1/sessions/fmt/usage"
    anthropic = {"input_tokens": 500, "cache_read_input_tokens": 1000, "output_tokens": 9}
    r = await client.post(url, params={"format": "anthropic"}, json=anthropic)
    assert r.status_code == 200, r.text
    assert r.json()["usage_format"] == "anthropic"
    assert r.json()["reported_prompt_tokens"] == 1500
    r = await client.post(url, json={"prompt_tokens": 700, "format": "openai"})
    assert r.status_code == 200, r.text
    assert r.json()["usage_format"] == "openai_chat"
    r = await client.post(
        url, params={"format": "openai"}, json={"input_tokens": 9, "format": "openai"}
    )
    assert r.status_code == 200, r.text
    # The last usage records the figures, not the format.
    assert "format" not in (await get_session(client, "fmt"))["last_usage"]

    before = await get_session(client, "fmt")
    r = await client.post(
        url, params={"format": "openai"}, json={**anthropic, "format": "anthropic"}
    )
    doc = assert_problem(r, 422, "format", "'openai'", "'anthropic'", "differ")
    assert doc["errors"][0]["field"] == "format"
    assert await get_session(client, "fmt") == before
