"""Schemathesis against the live OpenAPI spec of a real uvicorn server.

Every operation of ``/openapi.json`` (as served, not the committed copy) is fuzzed
with the spec's examples and with random valid and invalid requests (NUL and any
other Unicode in strings), its path parameters often naming a seeded session and
compaction so that the routes are exercised past their 404; then a stateful run
follows the spec's links (create a session, then use its id on its sub-routes).
Every response must be a non-5xx, documented status with the documented content
type and body schema.

schemathesis's own pytest integration (``from_fixture``) does not run on pytest 9
(it renames ``Item._nodeid``), so the cases are drawn with its public Hypothesis
strategies (``APIOperation.as_strategy``, ``BaseSchema.as_state_machine``) here.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test
from schemathesis import GenerationMode
from schemathesis.checks import (
    CheckFunction,
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.result import Ok

from app.core.settings import Settings
from app.main import create_app
from tests.e2e.server import running
from tests.ops.conftest import create_key

# A slow tier: `make test` and CI run it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

SEED = 20_240_521
# Cases per operation (examples, positive and negative ones, seeded or not, all told);
# the whole file runs in about a minute on two cores.
MAX_EXAMPLES = 150
KEYED_EXAMPLES = 40
STATEFUL_SCENARIOS = 100
STATEFUL_STEPS = 10

CONFIG: dict[str, Any] = {
    "seed": SEED,
    "generation": {
        "max-examples": MAX_EXAMPLES,
        "deterministic": True,
        # Strings may hold NUL and any other code point UTF-8 can carry.
        "allow-x00": True,
        "codec": "utf-8",
    },
}

CHECKS: list[CheckFunction] = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]

HYPOTHESIS = hsettings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)

Operation = schemathesis.APIOperation[Any, Any, Any, Any]
Case = schemathesis.Case[Any]

MAIN = "fuzz-main"
VICTIM = "fuzz-victim"


@dataclass
class Live:
    """A live server, the seeded ids on it and what the fuzzing saw."""

    base_url: str
    compaction_id: str
    key: str | None = None
    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    stateful: dict[str, Counter[int]] = field(default_factory=dict)


def _conversation(steps: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Fix the date parser in src/dates.py."},
    ]
    for k in range(steps):
        call = {
            "id": f"call_{k}",
            "type": "function",
            "function": {"name": "bash", "arguments": f'{{"command": "cat src/mod{k}.py"}}'},
        }
        out.append({"role": "assistant", "content": f"Reading module {k}.", "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"call_{k}", "content": f"x = {k}\n" * 60})
    return out


def seed_session(
    base_url: str, session_id: str, *, compact: bool, key: str | None = None
) -> str | None:
    """A session with a dozen tool turns; with ``compact``, a finished compaction's id."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=base_url, timeout=60, headers=headers) as client:
        body = {
            "id": session_id,
            "model": "gpt-4o-mini",
            "config": {"compaction": {"keep_recent_tokens": 200}},
        }
        r = client.post("/v1/sessions", json=body)
        assert r.status_code == 201, r.text
        r = client.post(f"/v1/sessions/{session_id}/messages", json={"messages": _conversation(12)})
        assert r.status_code == 201, r.text
        if not compact:
            return None
        r = client.post(f"/v1/sessions/{session_id}/compactions", json={"wait": 30})
        assert r.status_code == 202, r.text
        assert r.json()["status"] == "succeeded", r.text
        compaction_id: str = r.json()["id"]
        return compaction_id


@contextlib.contextmanager
def serving(
    db_url: str, settings: Settings, *, workers: int, key: str | None = None
) -> Iterator[Live]:
    """The app as the ``app`` fixture builds it, served by uvicorn, with seeded sessions."""
    app = create_app(
        settings.model_copy(update={"compaction_workers": workers}), database_url=db_url
    )
    with running(app) as base_url:
        compaction_id = seed_session(base_url, MAIN, compact=workers > 0, key=key)
        seed_session(base_url, VICTIM, compact=False, key=key)
        yield Live(base_url=base_url, compaction_id=compaction_id or str(uuid.uuid4()), key=key)


@pytest.fixture
def live(db_url: str, settings: Settings) -> Iterator[Live]:
    """One compaction worker: a seeded compaction that finished, and a request's
    ``wait`` ends when its compaction does."""
    with serving(db_url, settings, workers=1) as server:
        yield server


@pytest.fixture
async def live_with_a_key(db_url: str, settings: Settings) -> AsyncIterator[Live]:
    """API keys on: every /v1 request needs one (the seeded sessions are its tenant's)."""
    key = await create_key(db_url, "fuzz")
    with serving(db_url, settings, workers=1, key=key) as server:
        yield server


@pytest.fixture
def live_without_workers(db_url: str, settings: Settings) -> Iterator[Live]:
    """No worker: compactions stay queued, so that each scenario sees the same answers."""
    with serving(db_url, settings, workers=0) as server:
        yield server


def load_schema(live: Live) -> schemathesis.BaseSchema:
    config = schemathesis.Config.from_dict(CONFIG)
    return schemathesis.openapi.from_url(f"{live.base_url}/openapi.json", config=config)


def _seeded_parameters(operation: Operation, live: Live) -> list[dict[str, Any]]:
    """Fixed path parameters that name things that exist (the generated ones rarely do)."""
    names = {p.name for p in operation.path_parameters}
    if "session_id" not in names:
        return []
    is_delete = operation.method.upper() == "DELETE" and operation.path.endswith("{session_id}")
    session_id = VICTIM if is_delete else MAIN
    if "compaction_id" in names:
        return [
            {"session_id": session_id},
            {"session_id": session_id, "compaction_id": live.compaction_id},
        ]
    return [{"session_id": session_id}]


def _with_path(case: Case, fixed: dict[str, Any]) -> Case:
    case.path_parameters = {**(case.path_parameters or {}), **fixed}
    return case


# Text as agents send it, and then some: any code point UTF-8 carries, NUL included.
TEXT = st.text(max_size=80)
CALL_ID = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12)


@st.composite
def openai_turn(draw: st.DrawFn) -> list[dict[str, Any]]:
    role = draw(st.sampled_from(["system", "developer", "user", "assistant", "call"]))
    if role != "call":
        return [{"role": role, "content": draw(TEXT)}]
    call_id = draw(CALL_ID)
    arguments = draw(st.one_of(TEXT, st.just('{"command": "ls"}')))
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": draw(TEXT), "arguments": arguments},
    }
    turn: list[dict[str, Any]] = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    if draw(st.booleans()):  # else: a call still pending
        turn.append({"role": "tool", "tool_call_id": call_id, "content": draw(TEXT)})
    return turn


@st.composite
def anthropic_turn(draw: st.DrawFn) -> list[dict[str, Any]]:
    kind = draw(st.sampled_from(["user", "assistant", "blocks", "call"]))
    if kind in ("user", "assistant"):
        return [{"role": kind, "content": draw(TEXT)}]
    if kind == "blocks":
        blocks = [{"type": "text", "text": draw(TEXT)}]
        if draw(st.booleans()):
            blocks.insert(0, {"type": "thinking", "thinking": draw(TEXT), "signature": "sig"})
        return [{"role": "assistant", "content": blocks}]
    call_id = draw(CALL_ID)
    use = {"type": "tool_use", "id": call_id, "name": draw(TEXT), "input": {"q": draw(TEXT)}}
    result = {"type": "tool_result", "tool_use_id": call_id, "content": draw(TEXT)}
    return [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]


def _batch(
    turn: st.SearchStrategy[list[dict[str, Any]]],
) -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(turn, min_size=1, max_size=4).map(lambda turns: [m for t in turns for m in t])


APPEND_BODY = st.one_of(
    st.fixed_dictionaries(
        {"messages": _batch(openai_turn())}, optional={"format": st.just("openai")}
    ),
    st.fixed_dictionaries({"messages": _batch(anthropic_turn()), "format": st.just("anthropic")}),
)


def operation_strategy(operation: Operation, live: Live) -> st.SearchStrategy[Case]:
    """The spec's examples, and positive and negative cases, each both with generated
    path parameters and with seeded ones; for appends, also realistic message batches."""
    seeded = _seeded_parameters(operation, live)
    strategies = []
    for example in operation.get_strategies_from_examples():
        strategies.append(example)
        strategies.extend(example.map(partial(_with_path, fixed=fixed)) for fixed in seeded)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        strategies.append(operation.as_strategy(generation_mode=mode))
        for fixed in seeded:
            strategies.append(operation.as_strategy(generation_mode=mode, path_parameters=fixed))
    if operation.method.upper() == "POST" and operation.path.endswith("/messages"):
        strategies.append(
            APPEND_BODY.flatmap(
                lambda body: operation.as_strategy(body=body, path_parameters={"session_id": MAIN})
            )
        )
    return st.one_of(strategies)


# With keys on, a case carries the key, none, or a key that is wrong in some way.
CREDENTIALS = ["key", "none", "forged", "garbage"]


def _authorization(live: Live, credential: str) -> dict[str, str]:
    assert live.key is not None
    forged = live.key[:-1] + ("A" if live.key[-1] != "A" else "B")
    return {
        "key": {"Authorization": f"Bearer {live.key}"},
        "none": {},
        "forged": {"Authorization": f"Bearer {forged}"},
        "garbage": {"Authorization": "Bearer \u00e9t\u00e9 cpd_"},
    }[credential]


def run_operation(operation: Operation, live: Live, max_examples: int = MAX_EXAMPLES) -> None:
    counts = live.statuses.setdefault(operation.label, Counter())
    credentials = st.sampled_from(CREDENTIALS) if live.key else st.just("open")

    @seed(SEED)
    @hsettings(HYPOTHESIS, max_examples=max_examples)
    @given(case=operation_strategy(operation, live), credential=credentials)
    def fuzz(case: Case, credential: str) -> None:
        headers = _authorization(live, credential) if live.key else None
        response = case.call_and_validate(checks=CHECKS, headers=headers)
        counts[response.status_code] += 1
        if case.path_parameters == {"session_id": VICTIM} and response.status_code == 204:
            seed_session(live.base_url, VICTIM, compact=False, key=live.key)

    fuzz()


def test_every_operation_conforms(live: Live) -> None:
    fuzz_every_operation(live, MAX_EXAMPLES)


def test_every_operation_conforms_with_api_keys(live_with_a_key: Live) -> None:
    """The same with keys on: the key, none, a forged one and garbage, on every route
    (401s included must match the spec)."""
    fuzz_every_operation(live_with_a_key, KEYED_EXAMPLES)


def fuzz_every_operation(live: Live, max_examples: int) -> None:
    schema = load_schema(live)
    started = time.monotonic()
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            failures.append(f"the spec does not load: {result.err()}")
            continue
        operation = result.ok()
        operations += 1
        try:
            run_operation(operation, live, max_examples)
        except (Exception, BaseExceptionGroup) as exc:
            failures.append(f"{operation.label}:\n{exc}")
    print(f"\n{operations} operations in {time.monotonic() - started:.1f} s")
    for label, counts in live.statuses.items():
        print(f"  {label}: {dict(sorted(counts.items()))}")
    assert operations >= 19
    assert not failures, "\n\n".join(failures)


def test_stateful_links(live_without_workers: Live) -> None:
    """Follows the spec's links: create a session, then work on it by its id.

    Hypothesis replays scenarios and insists that the same choices lead to the same
    rules, so every scenario starts from the same server state: no sessions (earlier
    scenarios' are deleted), no worker moves a compaction on behind its back, and a
    compaction request does not ``wait`` (for a worker there is none of)."""
    live = live_without_workers
    schema = load_schema(live)
    machine = schema.as_state_machine()

    class Checked(machine):  # type: ignore[valid-type, misc]
        def setup(self) -> None:
            with httpx.Client(base_url=live.base_url, timeout=60) as client:
                r = client.get("/v1/sessions", params={"limit": 500})
                assert r.status_code == 200, r.text
                for session in r.json()["sessions"]:
                    client.delete(f"/v1/sessions/{session['id']}")

        def before_call(self, case: Case) -> None:
            body = case.body
            if isinstance(body, dict) and isinstance(body.get("wait"), int | float):
                body["wait"] = 0

        def validate_response(
            self,
            response: schemathesis.Response,
            case: Case,
            additional_checks: list[CheckFunction] | None = None,
            **kwargs: Any,
        ) -> None:
            counts = live.stateful.setdefault(case.operation.label, Counter())
            counts[response.status_code] += 1
            case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs or None)

    started = time.monotonic()
    run_state_machine_as_test(
        Checked,
        settings=hsettings(
            HYPOTHESIS, max_examples=STATEFUL_SCENARIOS, stateful_step_count=STATEFUL_STEPS
        ),
    )
    print(f"\nstateful: {STATEFUL_SCENARIOS} scenarios in {time.monotonic() - started:.1f} s")
    for label, counts in sorted(live.stateful.items()):
        print(f"  {label}: {dict(sorted(counts.items()))}")
