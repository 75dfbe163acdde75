"""Open-loop load: mixed agent traffic against many sessions at a fixed arrival rate.

Each of ``SESSIONS`` sessions is an agent replaying one of the real traces: it
starts with a prefix of its trace stored, and every turn it appends the next
step (the assistant message and the tool results that answer it, with an
``Idempotency-Key``), reads its context (``openai``, or ``anthropic`` for the
Claude sessions) and reports the prompt's usage. When a trace runs out the
agent starts it again with fresh tool-call ids.

Every run starts from fresh sessions in the same state (same traces, same
prefixes), so each rate is a share of a maximum measured on the same work.

1. Maximum rate. First a closed loop: ``SATURATION_AGENTS`` agents doing turns back
   to back for a few seconds (printed: the closed-loop rate). Then the maximum
   open-loop rate, by bisection over short open-loop runs between half and all of
   the closed-loop rate: the highest rate with no error, p99 under a second and
   every answer in within half a second of the schedule's end. It is the lower of
   the two: open-loop arrivals come in bursts, and a turn's append and usage report
   meet on the session's row lock, where a closed-loop agent sends them one after
   the other. The runs below are shares of this open-loop maximum.
2. Open loop at 50 % and 90 % of that rate: a Poisson schedule of requests is
   computed in advance (turn after turn: append, context, usage, each its own
   arrival), every request is sent at its scheduled time whatever the earlier
   ones are doing, and its latency runs from the scheduled time, so a stall of
   the service is charged to every request it delays (no coordinated omission).
   The generator's own lag (actual send minus scheduled time, including the wait
   for a free connection) is printed, as is its CPU.

Memory is the service process's (the load generator is this process): its
``VmHWM`` is reset before each run (``/proc/<pid>/clear_refs``) and read after,
and its RSS is sampled every 100 ms. The bench prints; it never fails on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

from app.engine.accounting import tokens
from app.engine.formats import openai_format
from bench.http import Connection
from tests import traces

# Many sessions, so that each grows by a few turns in a run and the work stays
# close to what the maximum rate was measured on.
SESSIONS = 1000
SEED = 20240611
CAPACITY_PROBES = 5
CAPACITY_SECONDS = 8.0
SATURATION_AGENTS = 48
SATURATION_SECONDS = 12.0
SATURATION_WARMUP = 2.0
MAX_CONNECTIONS = 512
REQUEST_TIMEOUT = 30.0
# The service closes keep-alive connections idle for 5 s; never reuse one near that.
IDLE_REUSE_SECONDS = 3.0
MODELS = ("gpt-4o", "claude-sonnet-4", "gpt-4.1")
KINDS = ("append", "context", "usage")
# What a real prompt adds to the stored history: system tools and framing.
TOOLS_OVERHEAD_TOKENS = 1_200


def default_seconds() -> float:
    return float(os.environ.get("COMPACTD_BENCH_LOAD_SECONDS", "60"))


# ---------------------------------------------------------------- the agents


@dataclass
class Trace:
    opening: list[dict[str, Any]]
    steps: list[list[dict[str, Any]]]
    step_tokens: list[int]
    opening_tokens: int


def load_traces() -> list[Trace]:
    out = []
    for path in traces.trace_files():
        batches = traces.turns(traces.load(path))
        opening = batches[0]
        steps: list[list[dict[str, Any]]] = []
        for batch in batches[1:]:
            if batch[0]["role"] == "assistant" or not steps:
                steps.append(list(batch))
            else:
                steps[-1].extend(batch)

        def count(msgs: list[dict[str, Any]]) -> int:
            return sum(tokens.count_entry(openai_format.parse_message(m, "m")) for m in msgs)

        out.append(Trace(opening, steps, [count(s) for s in steps], count(opening)))
    return out


def renamed(step: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    """The step with its tool-call ids made new (for a trace replayed again)."""
    if not suffix:
        return step
    out = []
    for m in step:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "id": c["id"] + suffix} for c in m["tool_calls"]]}
        elif m["role"] == "tool":
            m = {**m, "tool_call_id": m["tool_call_id"] + suffix}
        out.append(m)
    return out


@dataclass
class Agent:
    index: int
    trace: Trace
    model: str
    position: int
    sid: str = ""
    cycle: int = 0
    turn: int = 0
    stored_tokens: int = 0

    @property
    def format(self) -> str:
        return "anthropic" if self.model.startswith("claude") else "openai"

    def next_turn(self, phase: str) -> list[Request]:
        """The three requests of the agent's next turn."""
        if self.position >= len(self.trace.steps):
            self.position, self.cycle = 0, self.cycle + 1
        k = self.position
        step = renamed(self.trace.steps[k], f"-r{self.cycle}" if self.cycle else "")
        self.position += 1
        self.turn += 1
        self.stored_tokens += self.trace.step_tokens[k]
        base = f"/v1/sessions/{self.sid}"
        prompt = int(self.stored_tokens * 1.03) + TOOLS_OVERHEAD_TOKENS
        reply = self.trace.step_tokens[(k + 1) % len(self.trace.steps)]
        return [
            Request(
                "append",
                "POST",
                f"{base}/messages",
                {"messages": step},
                {"Idempotency-Key": f"load-{phase}-{self.index}-{self.turn}"},
            ),
            Request("context", "GET", f"{base}/context?format={self.format}"),
            Request(
                "usage",
                "POST",
                f"{base}/usage",
                {"input_tokens": prompt, "output_tokens": min(reply, 4_000)},
            ),
        ]


@dataclass
class Request:
    kind: str
    method: str
    path: str
    body: Any = None
    headers: dict[str, str] | None = None


async def create_agents(pool: Pool, rng: random.Random) -> list[Agent]:
    all_traces = load_traces()
    agents = []
    for i in range(SESSIONS):
        trace = all_traces[i % len(all_traces)]
        # Each agent is somewhere between a tenth and two thirds into its trace.
        start = rng.randint(len(trace.steps) // 10, 2 * len(trace.steps) // 3)
        agents.append(Agent(i, trace, MODELS[i % len(MODELS)], start))

    async def create(agent: Agent) -> None:
        status, body = await pool.request(
            "POST", "/v1/sessions", {"model": agent.model, "metadata": {"bench": "load"}}
        )
        assert status == 201, body
        agent.sid = orjson.loads(body)["id"]
        prefix = list(agent.trace.opening)
        for step in agent.trace.steps[: agent.position]:
            prefix.extend(step)
        status, body = await pool.request(
            "POST", f"/v1/sessions/{agent.sid}/messages", {"messages": prefix}
        )
        assert status == 201, body
        agent.stored_tokens = agent.trace.opening_tokens + sum(
            agent.trace.step_tokens[: agent.position]
        )

    sem = asyncio.Semaphore(8)

    async def guarded(agent: Agent) -> None:
        async with sem:
            await create(agent)

    await asyncio.gather(*(guarded(a) for a in agents))
    return agents


# ---------------------------------------------------------------- the client


class Pool:
    """Keep-alive connections handed out one request at a time, at most ``limit`` open."""

    def __init__(self, host: str, port: int, limit: int) -> None:
        self.host, self.port = host, port
        self._sem = asyncio.Semaphore(limit)
        self._idle: list[tuple[Connection, float]] = []
        self.opened = 0
        self.open = 0
        self.peak_open = 0

    async def _get(self) -> Connection:
        now = time.monotonic()
        while self._idle:
            conn, last = self._idle.pop()
            if now - last < IDLE_REUSE_SECONDS and not conn.closed:
                return conn
            self._drop(conn)
        conn = Connection(self.host, self.port)
        await conn.__aenter__()
        self.opened += 1
        self.open += 1
        self.peak_open = max(self.peak_open, self.open)
        return conn

    def _drop(self, conn: Connection) -> None:
        self.open -= 1
        conn.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        on_send: list[float] | None = None,
    ) -> tuple[int, bytes]:
        async with self._sem:
            conn = await self._get()
            if on_send is not None:
                on_send.append(time.monotonic())
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT):
                    result = await conn.request(method, path, body, headers)
            except BaseException:
                self._drop(conn)
                raise
            self._idle.append((conn, time.monotonic()))
            return result

    def close(self) -> None:
        for conn, _ in self._idle:
            self._drop(conn)
        self._idle.clear()


# ---------------------------------------------------------------- measuring


@dataclass
class Stats:
    latency: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    statuses: dict[str, Counter[str]] = field(
        default_factory=lambda: {k: Counter[str]() for k in KINDS}
    )
    first_error: dict[str, str] = field(default_factory=dict)
    # (scheduled time, latency) of every request, for the timeline.
    timeline: list[tuple[float, float]] = field(default_factory=list)
    effects: Counter[str] = field(default_factory=Counter)
    started: float = 0.0  # the monotonic time the schedule's offsets count from

    def record(self, kind: str, at: float, seconds: float, status: str, body: bytes = b"") -> None:
        self.latency[kind].append(seconds)
        self.timeline.append((at, seconds))
        if kind != "context" and status.startswith("2"):
            # What the write set off: an automatic prune or compaction (small bodies).
            answer = orjson.loads(body)
            if (answer.get("pruned") or {}).get("pruned"):
                self.effects[f"{kind} pruned"] += 1
            if compaction := answer.get("compaction"):
                self.effects[f"{kind} compaction {compaction['reason']}"] += 1
        self.statuses[kind][status] += 1
        if not status.startswith("2") and status not in self.first_error:
            self.first_error[status] = body[:300].decode("utf-8", "replace")

    def errors(self, kind: str | None = None) -> int:
        kinds = [kind] if kind else list(KINDS)
        return sum(
            n for k in kinds for status, n in self.statuses[k].items() if not status.startswith("2")
        )

    def count(self) -> int:
        return sum(len(v) for v in self.latency.values())


async def send(
    pool: Pool, req: Request, stats: Stats, at: float, write_lag: list[float] | None = None
) -> None:
    sent: list[float] = []
    try:
        status, body = await pool.request(req.method, req.path, req.body, req.headers, sent)
        code = str(status)
    except TimeoutError:
        code, body = "timeout", b""
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
        code, body = f"transport:{type(exc).__name__}", str(exc).encode()
    stats.record(req.kind, at, time.monotonic() - at, code, body)
    if write_lag is not None and sent:
        write_lag.append(sent[0] - at)


class Memory:
    """The service's peak memory: VmHWM (reset first) and RSS sampled every 100 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.proc = psutil.Process(pid)
        self.rss_max = 0
        self.reset = False
        self._task: asyncio.Task[None] | None = None

    def status(self, key: str) -> int:
        for row in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if row.startswith(key + ":"):
                return int(row.split()[1]) * 1024
        return 0

    def start(self) -> None:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
            self.reset = True
        except OSError:
            self.reset = False
        self.rss_max = self.proc.memory_info().rss
        self._task = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            self.rss_max = max(self.rss_max, self.proc.memory_info().rss)
            await asyncio.sleep(0.1)

    async def stop(self) -> tuple[float, float, float]:
        """(VmHWM, sampled RSS max, RSS now) in MB."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        rss = self.proc.memory_info().rss
        self.rss_max = max(self.rss_max, rss)
        return self.status("VmHWM") / 2**20, self.rss_max / 2**20, rss / 2**20


class Cpu:
    """CPU seconds, as a share of one core over a run: the service, its PostgreSQL
    (the postmaster and its backends), this generator, and the machine as a whole
    (other processes on the machine, such as test suites, show up as "other")."""

    def __init__(self, server: psutil.Process, pgdata: Path | None) -> None:
        self.server = server
        self.shares: dict[str, float] = {}  # the last run's, as shares of one core
        self.postmaster: psutil.Process | None = None
        if pgdata is not None:
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                pid = int((pgdata / "postmaster.pid").read_text().split()[0])
                self.postmaster = psutil.Process(pid)

    def _postgres(self) -> float:
        if self.postmaster is None:
            return 0.0
        t = self.postmaster.cpu_times()
        total = float(t.user + t.system + t.children_user + t.children_system)
        for child in self.postmaster.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                total += c.user + c.system
        return total

    def _read(self) -> tuple[float, float, float, float, float]:
        machine = psutil.cpu_times()
        busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        # The service's processes: one, or `serve --workers N`'s supervisor and servers.
        service = 0.0
        for process in (self.server, *self.server.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                service += sum(process.cpu_times()[:2])
        return time.monotonic(), service, self._postgres(), time.process_time(), busy

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> str:
        end = self._read()
        wall = end[0] - self._start[0]
        service, postgres, generator, machine = (
            (b - a) / wall for a, b in zip(self._start[1:], end[1:], strict=True)
        )
        other = machine - service - postgres - generator
        self.shares = {
            "service": service,
            "postgres": postgres,
            "generator": generator,
            "other": other,
        }
        pg = f", PostgreSQL {postgres:.0%}" if self.postmaster is not None else ""
        return (
            f"CPU (share of one core; {os.cpu_count()} cores): service {service:.0%}{pg},"
            f" generator {generator:.0%}, machine {machine:.0%} (other processes {other:.0%})"
        )


def ms(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def stalls(stats: Stats, start: float) -> str:
    """The seconds of the run whose requests waited longest."""
    worst: dict[int, float] = {}
    slow: Counter[int] = Counter()
    for at, seconds in stats.timeline:
        second = int(at - start)
        worst[second] = max(worst.get(second, 0.0), seconds)
        if seconds > 0.1:
            slow[second] += 1
    top = sorted(worst.items(), key=lambda kv: -kv[1])[:4]
    over = sum(1 for v in worst.values() if v > 0.1)
    listed = ", ".join(f"t={s}s max {v * 1000:.0f} ms ({slow[s]} > 100 ms)" for s, v in top)
    return f"{over} of {len(worst)} seconds had a request over 100 ms; worst: {listed}"


def report(stats: Stats, wall: float) -> None:
    for kind in KINDS:
        lat = stats.latency[kind]
        breakdown = ", ".join(f"{s}: {n}" for s, n in sorted(stats.statuses[kind].items()))
        print(
            f"  {kind:<8} {len(lat):6d} req {len(lat) / wall:7.1f}/s"
            f"  p50 {ms(lat, 0.5):8.2f} ms  p99 {ms(lat, 0.99):8.2f} ms"
            f"  max {max(lat, default=0) * 1000:8.2f} ms"
            f"  errors {stats.errors(kind)}  [{breakdown}]"
        )
    if stats.effects:
        listed = ", ".join(f"{k}: {n}" for k, n in sorted(stats.effects.items()))
        print(f"  automatic actions started by the writes: {listed}")
    for status, body in stats.first_error.items():
        print(f"  first {status} body: {body}")


# ---------------------------------------------------------------- the runs


async def saturation(pool: Pool, agents: list[Agent], cpu: Cpu) -> float:
    """Requests per second of the mix with ``SATURATION_AGENTS`` agents back to back."""
    stats = Stats()
    order = iter(range(10**9))
    loop_start = time.monotonic()
    measure_from = loop_start + SATURATION_WARMUP
    stop_at = measure_from + SATURATION_SECONDS
    done_in_window = 0

    async def agent_loop() -> None:
        nonlocal done_in_window
        while time.monotonic() < stop_at:
            agent = agents[next(order) % len(agents)]
            for req in agent.next_turn("sat"):
                t = time.monotonic()
                await send(pool, req, stats, t)
                if t >= measure_from and time.monotonic() <= stop_at:
                    done_in_window += 1

    async def measure_cpu() -> str:
        await asyncio.sleep(SATURATION_WARMUP)
        cpu.start()
        await asyncio.sleep(SATURATION_SECONDS)
        return cpu.stop()

    marker = asyncio.create_task(measure_cpu())
    await asyncio.gather(*(agent_loop() for _ in range(SATURATION_AGENTS)))
    used = await marker
    rate = done_in_window / SATURATION_SECONDS
    wall = time.monotonic() - loop_start
    print(
        f"\n  saturation: closed loop, {SATURATION_AGENTS} agents back to back,"
        f" {SATURATION_SECONDS:.0f} s after {SATURATION_WARMUP:.0f} s warm-up"
    )
    report(stats, wall)
    print(f"  closed-loop rate: {rate:.0f} req/s ({rate / 3:.0f} agent turns/s)")
    print(f"  {used}")
    return rate


@dataclass
class RunResult:
    rate: float
    stats: Stats
    hwm: float
    rss_max: float


def poisson_schedule(
    agents: list[Agent], rate: float, seconds: float, label: str, rng: random.Random
) -> list[tuple[float, Request]]:
    """Computed before the clock starts: Poisson arrivals, turn after turn."""
    schedule: list[tuple[float, Request]] = []
    t = 0.0
    while t < seconds:
        agent = agents[rng.randrange(len(agents))]
        for req in agent.next_turn(label):
            t += rng.expovariate(rate)
            schedule.append((t, req))
    return [(at, req) for at, req in schedule if at < seconds]


async def play(
    pool: Pool, schedule: list[tuple[float, Request]]
) -> tuple[Stats, list[float], list[float], float, float]:
    """Send each request at its time, whatever the earlier ones are doing: (stats, dispatch
    lags, write lags, seconds to dispatch the schedule, seconds until the last answer)."""
    stats = Stats()
    lag: list[float] = []
    sent: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic() + 0.05
    for offset, req in schedule:
        at = start + offset
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        lag.append(time.monotonic() - at)
        task = asyncio.create_task(send(pool, req, stats, at, sent))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    dispatched = time.monotonic() - start
    await asyncio.gather(*tasks)
    stats.started = start
    return stats, lag, sent, dispatched, time.monotonic() - start


async def open_loop_capacity(pool: Pool, agents: list[Agent], closed_rate: float) -> float:
    """The highest arrival rate the service keeps up with, open loop: a bisection over
    short runs between half and all of the closed-loop rate. A rate is kept up with when
    nothing fails, every answer is in within half a second of the schedule's end and
    p99 stays under a second. Open-loop arrivals come in bursts, and an append and the
    usage report of the same turn meet on the session's lock, so this is lower than
    the closed-loop rate, where each agent waits for one answer before the next."""
    rng = random.Random(SEED)
    low, high = 0.5 * closed_rate, closed_rate
    print(
        f"\n  open-loop maximum: bisection, {CAPACITY_PROBES} runs of {CAPACITY_SECONDS:.0f} s"
        f" between {low:.0f} and {high:.0f} req/s"
    )
    for _ in range(CAPACITY_PROBES):
        rate = (low + high) / 2
        schedule = poisson_schedule(agents, rate, CAPACITY_SECONDS, "probe", rng)
        stats, _, _, _, wall = await play(pool, schedule)
        every = [x for kind in KINDS for x in stats.latency[kind]]
        late = wall - CAPACITY_SECONDS
        kept_up = stats.errors() == 0 and late <= 0.5 and ms(every, 0.99) < 1000
        print(
            f"    {rate:6.0f} req/s: p50 {ms(every, 0.5):7.2f} ms, p99 {ms(every, 0.99):8.2f} ms,"
            f" errors {stats.errors()}, done {late:+.2f} s after the schedule:"
            f" {'kept up' if kept_up else 'fell behind'}"
        )
        if kept_up:
            low = rate
        else:
            high = rate
        await asyncio.sleep(3)  # whatever queued drains before the next probe
    print(f"  max sustainable rate, open loop: {low:.0f} req/s ({low / 3:.0f} agent turns/s)")
    return low


async def open_loop(
    pool: Pool,
    agents: list[Agent],
    server: psutil.Process,
    cpu: Cpu,
    rate: float,
    seconds: float,
    label: str,
    rng: random.Random,
) -> RunResult:
    schedule = poisson_schedule(agents, rate, seconds, label, rng)
    memory = Memory(server.pid)
    memory.start()
    cpu.start()
    stats, lag, sent, dispatched, wall = await play(pool, schedule)
    used = cpu.stop()
    hwm, rss_max, rss_now = await memory.stop()
    timeline = stalls(stats, stats.started)

    print(f"\n  {label}: open loop, target {rate:.0f} req/s for {seconds:.0f} s (Poisson)")
    report(stats, wall)
    print(
        f"  achieved: {len(schedule)} scheduled, {len(schedule) / dispatched:.1f} req/s sent"
        f" (target {rate:.1f}), {stats.count() / wall:.1f} req/s completed;"
        f" all done {wall - seconds:+.2f} s after the schedule's end"
    )
    print(
        f"  generator lag (dispatch vs schedule): p50 {ms(lag, 0.5):.2f} ms,"
        f" p99 {ms(lag, 0.99):.2f} ms, max {max(lag, default=0) * 1000:.2f} ms;"
        f" to the write (incl. connection wait), p99 {ms(sent, 0.99):.2f} ms;"
        f" connections open at peak {pool.peak_open}"
    )
    print(f"  timeline: {timeline}")
    print(
        f"  service: peak memory VmHWM {hwm:.0f} MB"
        f"{'' if memory.reset else ' (not reset: lifetime peak)'},"
        f" sampled RSS max {rss_max:.0f} MB, RSS at end {rss_now:.0f} MB"
    )
    print(f"  {used}")
    return RunResult(rate, stats, hwm, rss_max)


async def bench_load(
    host: str, port: int, server_pid: int, seconds: float | None = None, pgdata: Path | None = None
) -> None:
    seconds = default_seconds() if seconds is None else seconds
    print(
        f"\nLoad: open loop, mixed agent turns (append + context + usage) over {SESSIONS} sessions"
    )
    server = psutil.Process(server_pid)
    cpu = Cpu(server, pgdata)
    pool = Pool(host, port, MAX_CONNECTIONS)

    async def fresh_agents(label: str) -> list[Agent]:
        """New sessions in the same state for every run (same traces, same prefixes): the
        rates of the open-loop runs are shares of a maximum measured on the same work."""
        t = time.monotonic()
        agents = await create_agents(pool, random.Random(SEED))
        stored = sum(a.stored_tokens for a in agents)
        print(
            f"\n  {label}: {len(agents)} fresh sessions ({', '.join(MODELS)}) with trace"
            f" prefixes, {stored:,} tokens stored in {time.monotonic() - t:.1f} s;"
            f" service RSS {server.memory_info().rss / 2**20:.0f} MB"
        )
        await asyncio.sleep(2)
        return agents

    try:
        agents = await fresh_agents("maximum rate")
        closed = await saturation(pool, agents, cpu)
        rate = await open_loop_capacity(pool, agents, closed)
        results = []
        for share in (0.5, 0.9):
            label = f"{share:.0%} load"
            agents = await fresh_agents(label)
            rng = random.Random(SEED + int(share * 100))
            results.append(
                await open_loop(pool, agents, server, cpu, rate * share, seconds, label, rng)
            )
    finally:
        pool.close()

    half, high = results
    errors = sum(r.stats.errors() for r in results)
    ctx_p99 = ms(half.stats.latency["context"], 0.99)
    peak = max(max(r.hwm, r.rss_max) for r in results)

    def mark(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    print(
        f"  verdict: errors {errors} (target 0) {mark(errors == 0)};"
        f" context p99 at 50% {ctx_p99:.1f} ms (target <= 50) {mark(ctx_p99 <= 50)};"
        f" peak RSS {peak:.0f} MB (target <= 250) {mark(peak <= 250)}"
        f"  [90% load: context p99 {ms(high.stats.latency['context'], 0.99):.1f} ms]"
    )
