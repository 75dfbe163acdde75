"""The scorecard (docs/eval.md): what an agent keeps of its history after compaction, per
strategy, beside a naive baseline of the same size.

``make eval`` (or ``python -m bench eval``, or ``python -m bench.eval``) replays trace
files (the vendored ones, tests/data/traces, or ``--traces DIR``) through the real
service at a window (``--window``, 16,384 by default as :mod:`bench.continuity`): the
app in this process (httpx over ASGI) on a real PostgreSQL (``DATABASE_URL``'s server if
set, else an embedded one in a temporary folder), in a scratch database dropped at the
end. Each turn as the agent makes it: the usage its model reported
(:func:`bench.continuity.usage_prompt`), then its messages, a real compaction worker
run right after each request (as if instant), and the context read as the agent reads
it. A compaction is seen by the session's ``compaction_count`` going up; the range it
took out, by its ``first_kept_seq`` and the seqs the appends were given.

After each compaction, for each strategy (a row of :data:`STRATEGIES`: session-config
overrides) and for the newest raw messages within the same tokens
(:func:`bench.continuity.baseline`):

- **continuity** (:func:`bench.continuity.check`, the measurement's own rules): the
  task's terms kept, the modified files named and listed, the latest failure kept;
- **recall**: facts (:mod:`bench.eval_facts`) from everything compacted so far and not
  in the messages still kept verbatim, a few of each kind (seeded, the same for every
  strategy at the same compaction), found *in context* (the served context shows it) and
  *with one search* (``GET /v1/sessions/{id}/search`` with the fact's query, ``limit=5``:
  a hit's snippet shows it). The baseline has no search: in context only;
- the tokens kept (the session's context tokens right after), compactions counted.

``--json PATH`` writes the figures, per strategy and per trace, as one document.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import copy
import dataclasses
import gzip
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
from pydantic import ValidationError

from app.compactions.summarizer import Backoff
from app.compactions.worker import Worker, WorkerConfig
from app.core import embedded, migrations
from app.core.settings import Settings
from app.core.tokenizer import load_encodings
from app.engine.accounting import budget, ledger, tokens
from app.main import create_app
from app.sessions.schemas import SessionConfig
from bench import continuity, eval_facts
from bench import continuity_rules as rules
from tests import traces

WINDOW = continuity.WINDOW.context_window
PER_KIND = 3  # facts of each kind searched per compaction
SEED = "30"
SEARCH_LIMIT = 5

# Each strategy: session-config overrides over the replay's base config (:func:`config`).
STRATEGIES: dict[str, dict[str, Any]] = {
    "extractive": {"compaction": {"summarizer": "extractive"}},
    "verbatim_first": {
        "compaction": {
            "summarizer": "extractive",
            "policy": "verbatim_first",
            "verbatim_share": 0.25,
        }
    },
}


def window(context_window: int) -> budget.Window:
    """The replay's window: a quarter of it for the answer (16,384: 4,096, as
    bench.continuity)."""
    return budget.Window(context_window=context_window, max_output_tokens=context_window // 4)


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def config(context_window: int, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """bench.continuity's config scaled to the window (at 16,384 it is that config),
    with a strategy's overrides."""
    scale = context_window / continuity.WINDOW.context_window
    base = _merge(
        continuity.CONFIG,
        {
            "compaction": {"reserve_tokens": context_window // 4},
            "prune": {
                "protect_tokens": round(continuity.CONFIG["prune"]["protect_tokens"] * scale),
                "minimum_tokens": round(continuity.CONFIG["prune"]["minimum_tokens"] * scale),
            },
        },
    )
    return _merge(base, overrides)


def strategies(context_window: int, names: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The strategies' configs that SessionConfig takes; a note for each it refuses."""
    taken: dict[str, Any] = {}
    notes: list[str] = []
    for name in names:
        cfg = config(context_window, STRATEGIES[name])
        try:
            SessionConfig.model_validate(cfg)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            notes.append(
                f"{name}: skipped, the session config refuses it ({where}: {first['msg']})"
            )
            continue
        taken[name] = cfg
    return taken, notes


# --- traces ---------------------------------------------------------------------------


def trace_files(folder: Path | None) -> list[Path]:
    if folder is None:
        return traces.trace_files()
    files = sorted(
        p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz", ".jsonl.gz"))
    )
    if not files:
        raise SystemExit(f"{folder}: no trace files (*.json, *.json.gz)")
    return files


def load(path: Path) -> list[dict[str, Any]]:
    """A trace's messages: a JSON document with ``messages`` (gzipped or not), or a
    list of messages; a final ``exit`` record (mini-swe-agent's) left out."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    messages = data["messages"] if isinstance(data, dict) else data
    return [m for m in messages if m.get("role") != "exit"]


def trace_name(path: Path) -> str:
    return path.name.split(".")[0]


# --- the replay through the service ---------------------------------------------------


def new_worker(app: Any) -> Worker:
    """A real compaction worker on the app's engine, waiting on nothing between attempts."""
    config = WorkerConfig(
        lease_seconds=30.0,
        poll_seconds=0.05,
        backoff=Backoff(base_seconds=0.0, cap_seconds=0.0, max_attempts=3),
    )
    return Worker(app.state.engine, config, app.state.outbound)


async def drain(worker: Worker, limit: int = 100) -> int:
    """Run the worker until no job is due (tests/compactions/helpers.drain's loop)."""
    done = 0
    while done < limit and await worker.run_once():
        done += 1
    return done


def _ok(r: httpx.Response, status: int = 200) -> Any:
    if r.status_code != status:
        raise RuntimeError(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text}")
    return r.json()


def _prompt(state: Mapping[str, Any], batch: Sequence[dict[str, Any]], cfg: Any) -> int | None:
    """continuity.usage_prompt on the service's totals."""
    totals = dataclasses.replace(
        ledger.Totals(),
        stored_tokens=state["stored_tokens"],
        context_tokens=state["context_tokens"],
    )
    return continuity.usage_prompt(continuity.Session(cfg, totals=totals), batch)


def _share(values: Sequence[bool | None]) -> list[int]:
    counted = [v for v in values if v is not None]
    return [sum(counted), len(counted)]


async def replay(
    client: httpx.AsyncClient,
    worker: Worker,
    path: Path,
    strategy: str,
    cfg: dict[str, Any],
    *,
    context_window: int = WINDOW,
    per_kind: int = PER_KIND,
    seed: str = SEED,
    messages: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One trace through the service with one strategy; a row per compaction."""
    messages = messages if messages is not None else load(path)
    name = trace_name(path)
    win = window(context_window)
    session_config = SessionConfig.model_validate(cfg)
    checked = continuity.trace_facts(messages, continuity.ENCODING)
    facts = eval_facts.trace_facts(messages)
    raw = [rules.normalize(rules.message_text(m)) for m in messages]
    sid = f"eval-{strategy}-{name}"[:100] + f"-{uuid.uuid4().hex[:8]}"
    base = f"/v1/sessions/{sid}"
    state = _ok(
        await client.post(
            "/v1/sessions",
            json={
                "id": sid,
                "model": continuity.MODEL,
                "context_window": win.context_window,
                "max_output_tokens": win.max_output_tokens,
                "config": cfg,
            },
        ),
        201,
    )
    seqs: list[int] = []  # the seq of each trace message stored
    rows: list[dict[str, Any]] = []
    seen = 0

    async def measure() -> None:
        nonlocal seen
        if state["compaction_count"] <= seen:
            return
        seen = state["compaction_count"]
        page = _ok(await client.get(f"{base}/compactions", params={"limit": 10}))
        job = next(j for j in page["compactions"] if j["status"] == "succeeded")  # newest first
        context = _ok(await client.get(f"{base}/context"))["messages"]
        cut = bisect.bisect_left(seqs, job["first_kept_seq"])
        appended = len(seqs)
        kept_tokens = state["context_tokens"]
        ours = continuity.check(checked, cut, context, summary=True)
        plain, plain_tokens = continuity.baseline(checked, appended, kept_tokens)
        theirs = continuity.check(checked, cut, plain, summary=False)
        kept_text = " ".join(raw[cut:appended])
        pool = eval_facts.compacted_away(facts, cut, kept_text)
        picked = eval_facts.sample(pool, per_kind, f"{seed}:{name}:{len(rows) + 1}")
        ctx_text = rules.context_text(context)
        base_text = rules.context_text(plain)
        recall: list[dict[str, Any]] = []
        for fact in picked:
            r = await client.get(
                f"{base}/search", params={"q": fact.query[:500], "limit": SEARCH_LIMIT}
            )
            hits = _ok(r)["hits"]
            rank = next(
                (
                    i + 1
                    for i, hit in enumerate(hits)
                    if eval_facts.shown(fact, eval_facts.snippet_text(hit["snippet"]))
                ),
                None,
            )
            recall.append(
                {
                    "kind": fact.kind,
                    "fact": fact.text[:200],
                    "query": fact.query,
                    "in_context": eval_facts.shown(fact, ctx_text),
                    "baseline_in_context": eval_facts.shown(fact, base_text),
                    "search_rank": rank,
                    "hits": len(hits),
                }
            )
        pool_counts = {k: sum(f.kind == k for f in pool) for k in eval_facts.KINDS}
        rows.append(
            {
                "n": len(rows) + 1,
                "compaction_count": seen,
                "reason": job["reason"],
                "status": job["status"],
                "first_kept_seq": job["first_kept_seq"],
                "cut_index": cut,
                "appended": appended,
                "tokens_after": kept_tokens,
                "baseline_tokens": plain_tokens,
                "compacted": dataclasses.asdict(ours),
                "baseline": dataclasses.asdict(theirs),
                "pool": pool_counts,
                "facts": recall,
            }
        )

    for batch in traces.turns(messages):
        prompt = _prompt(state, batch, session_config)
        if prompt is not None:
            body = {"input_tokens": prompt, "finish_reason": continuity.FINISH_REASON}
            answer = _ok(await client.post(f"{base}/usage", json=body))
            # A compaction the report started, run now; the session read again only then
            # (the next report's figures are read after the append below).
            if await drain(worker) or answer.get("compaction") is not None:
                state = _ok(await client.get(base))
                await measure()
        appended_now = _ok(await client.post(f"{base}/messages", json={"messages": batch}), 201)
        seqs.extend(e["seq"] for e in appended_now["entries"])
        await drain(worker)
        state = _ok(await client.get(base))
        await measure()
        # The agent reads its context before its next call.
        _ok(await client.get(f"{base}/context"))
    return {
        "trace": name,
        "strategy": strategy,
        "messages": len(messages),
        "compaction_count": state["compaction_count"],
        "compactions": rows,
    }


# --- figures --------------------------------------------------------------------------


def _avg(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def _ratio(passed: int, counted: int) -> float | None:
    return round(passed / counted, 4) if counted else None


def figures(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A strategy's figures over its traces' compactions, and its baseline's."""
    rows = [row for r in results for row in r["compactions"]]
    out: dict[str, Any] = {
        "traces": len(results),
        "compactions": sum(r["compaction_count"] for r in results),
        "compactions_measured": len(rows),
        "tokens_kept_avg": _avg([row["tokens_after"] for row in rows]),
    }
    for side in ("compacted", "baseline"):
        checks = [row[side] for row in rows]
        shares = [c["terms_kept"] / c["terms"] for c in checks if c["terms"]]
        figures_side: dict[str, Any] = {
            "continuity": {
                "task": _share([c["task"] for c in checks]),
                "task_terms_kept_avg": round(sum(shares) / len(shares), 4) if shares else None,
                "files_named": _share([c["named"] for c in checks]),
                "files_listed": _share([c["listed"] for c in checks]),
                "error": _share([c["error"] for c in checks]),
            },
        }
        recall: dict[str, Any] = {}
        for kind in (*eval_facts.KINDS, "all"):
            facts = [f for row in rows for f in row["facts"] if kind in ("all", f["kind"])]
            if side == "compacted":
                found = sum(f["in_context"] for f in facts)
                searched = sum(f["search_rank"] is not None for f in facts)
                recall[kind] = {
                    "facts": len(facts),
                    "in_context": found,
                    "search": searched,
                    "in_context_share": _ratio(found, len(facts)),
                    "search_share": _ratio(searched, len(facts)),
                }
            else:
                found = sum(f["baseline_in_context"] for f in facts)
                recall[kind] = {
                    "facts": len(facts),
                    "in_context": found,
                    "in_context_share": _ratio(found, len(facts)),
                }
        figures_side["recall"] = recall
        if side == "baseline":
            figures_side["tokens_kept_avg"] = _avg([row["baseline_tokens"] for row in rows])
            out["baseline"] = figures_side
        else:
            out.update(figures_side)
    return out


def _pct(value: Sequence[int] | float | None) -> str:
    if value is None:
        return "    -"
    if isinstance(value, float):
        return f"{100 * value:4.0f}%"
    passed, counted = value
    return "    -" if counted == 0 else f"{100 * passed / counted:4.0f}%"


def report(document: dict[str, Any]) -> None:
    print(
        f"\nScorecard: {len(document['traces'])} traces, window {document['window']:,},"
        f" up to {document['per_kind']} facts of each kind searched per compaction"
        f" (seed {document['seed']})"
    )
    for note in document["notes"]:
        print(f"  note: {note}")
    for name, f in document["strategies"].items():
        b = f["baseline"]
        print(
            f"\n{name}: {f['compactions']} compactions ({f['compactions_measured']} measured),"
            f" {f['tokens_kept_avg'] or 0:,.0f} context tokens kept on average;"
            f" the newest raw messages at the same size: {b['tokens_kept_avg'] or 0:,.0f}"
        )
        print(f"  {'continuity':<40} {'compacted':>10} {'baseline':>10}")
        c, bc = f["continuity"], b["continuity"]
        for label, key in (
            ("task: >= 80% of the request's terms", "task"),
            ("task terms kept on average", "task_terms_kept_avg"),
            ("every modified file named", "files_named"),
            ("every modified file listed", "files_listed"),
            ("the latest error kept", "error"),
        ):
            print(f"  {label:<40} {_pct(c[key]):>10} {_pct(bc[key]):>10}")
        print(
            f"  {'recall: facts compacted so far':<40} {'facts':>6} {'in context':>11}"
            f" {'one search':>11} {'baseline':>9}"
        )
        for kind in ("all", *eval_facts.KINDS):
            r, br = f["recall"][kind], b["recall"][kind]
            label = "all kinds" if kind == "all" else eval_facts.KIND_LABELS[kind]
            print(
                f"  {label:<40} {r['facts']:>6} {_pct(r['in_context_share']):>11}"
                f" {_pct(r['search_share']):>11} {_pct(br['in_context_share']):>9}"
            )
    print(f"\n  elapsed {document['elapsed_seconds']:.1f} s")


# --- the database and the app -----------------------------------------------------------


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    """A migrated scratch database (an asyncpg SQLAlchemy URL), dropped at the end: on
    DATABASE_URL's server if set, else on an embedded server in a temporary folder."""
    folder: Path | None = None
    if os.environ.get("DATABASE_URL"):
        admin = embedded.to_async_url(os.environ["DATABASE_URL"])
    else:
        folder = Path(tempfile.mkdtemp(prefix="compactd-eval-"))
        admin = embedded.start(folder / "pgdata", cleanup_mode="delete", database="postgres")
    name = f"compactd_eval_{uuid.uuid4().hex[:12]}"
    dsn = admin.replace("postgresql+asyncpg://", "postgresql://", 1)

    async def admin_do(*statements: str) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for sql in statements:
                await conn.execute(sql)
        finally:
            await conn.close()

    url = urlunsplit(urlsplit(admin)._replace(path=f"/{name}"))
    try:
        # A scratch database need not survive a power cut: no waiting on fsync per commit.
        asyncio.run(
            admin_do(
                f'CREATE DATABASE "{name}"',
                f'ALTER DATABASE "{name}" SET synchronous_commit = off',
            )
        )
        migrations.upgrade(url)
        yield url
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(admin_do(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if folder is not None:
            embedded.stop(folder / "pgdata")
            shutil.rmtree(folder, ignore_errors=True)


async def evaluate(
    url: str,
    files: Sequence[Path],
    configs: Mapping[str, dict[str, Any]],
    *,
    context_window: int,
    per_kind: int,
    seed: str,
    progress: bool = True,
) -> dict[str, list[dict[str, Any]]]:
    settings = Settings(database_url=None, compaction_workers=0)
    app = create_app(settings, database_url=url)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    async with app.router.lifespan_context(app):
        worker = new_worker(app)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://compactd.eval") as c:
            for path in files:
                messages = load(path)
                for name, cfg in configs.items():
                    started = time.perf_counter()
                    result = await replay(
                        c,
                        worker,
                        path,
                        name,
                        cfg,
                        context_window=context_window,
                        per_kind=per_kind,
                        seed=seed,
                        messages=messages,
                    )
                    results[name].append(result)
                    if progress:
                        print(
                            f"  {trace_name(path):<36} {name:<16}"
                            f" {result['compaction_count']:>3} compactions"
                            f"  {time.perf_counter() - started:5.1f} s",
                            flush=True,
                        )
    return results


def run(
    *,
    folder: Path | None = None,
    limit: int | None = None,
    context_window: int = WINDOW,
    json_path: Path | None = None,
    names: Sequence[str] = tuple(STRATEGIES),
    per_kind: int = PER_KIND,
    seed: str = SEED,
) -> dict[str, Any]:
    started = time.perf_counter()
    tokens.register_encodings(load_encodings())
    files = trace_files(folder)[:limit]
    configs, notes = strategies(context_window, names)
    for note in notes:
        print(f"note: {note}")
    print(
        f"compactd eval: {len(files)} traces at window {context_window:,},"
        f" strategies {', '.join(configs) or 'none'}",
        flush=True,
    )
    with scratch_database() as url:
        results = asyncio.run(
            evaluate(
                url, files, configs, context_window=context_window, per_kind=per_kind, seed=seed
            )
        )
    document = scorecard(
        results,
        files,
        configs,
        notes,
        context_window=context_window,
        per_kind=per_kind,
        seed=seed,
        elapsed=time.perf_counter() - started,
    )
    report(document)
    if json_path is not None:
        json_path.write_text(json.dumps(document, indent=1))
        print(f"  written to {json_path}")
    return document


def scorecard(
    results: Mapping[str, Sequence[dict[str, Any]]],
    files: Sequence[Path],
    configs: Mapping[str, dict[str, Any]],
    notes: Sequence[str],
    *,
    context_window: int,
    per_kind: int,
    seed: str,
    elapsed: float,
) -> dict[str, Any]:
    """The scorecard as one JSON-ready document: the figures per strategy (its
    baseline's inside), and per trace."""
    return {
        "window": context_window,
        "max_output_tokens": window(context_window).max_output_tokens,
        "traces": [trace_name(p) for p in files],
        "per_kind": per_kind,
        "search_limit": SEARCH_LIMIT,
        "seed": seed,
        "notes": list(notes),
        "configs": dict(configs),
        "strategies": {name: figures(rs) for name, rs in results.items()},
        "per_trace": {
            name: [{**r, "figures": figures([r])} for r in rs] for name, rs in results.items()
        },
        "elapsed_seconds": round(elapsed, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench eval", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--traces", type=Path, help="a folder of trace files (default: vendored)")
    parser.add_argument("--limit", type=int, help="only the first N traces (by name)")
    parser.add_argument("--window", type=int, default=WINDOW, help="context window (16384)")
    parser.add_argument("--json", type=Path, help="write the scorecard as JSON to this path")
    parser.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help=f"comma-separated, of {', '.join(STRATEGIES)} (default: all)",
    )
    parser.add_argument(
        "--per-kind", type=int, default=PER_KIND, help="facts of each kind per compaction"
    )
    parser.add_argument("--seed", default=SEED, help="the facts' sampling seed")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    if unknown := [n for n in names if n not in STRATEGIES]:
        parser.error(f"unknown strategies: {', '.join(unknown)}")
    if args.window < 1024:
        parser.error("--window: at least 1024")
    run(
        folder=args.traces,
        limit=args.limit,
        context_window=args.window,
        json_path=args.json,
        names=names,
        per_kind=args.per_kind,
        seed=args.seed,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
