"""Slow and huge request heads (issue 11) against a real uvicorn server set up as
``compactd serve`` sets it up: headers trickled a byte at a time get 408 and the
connection closes within the header timeout, an 8 MB ``Authorization`` header gets 431
(or a closed connection) without being read whole, and the server serves others
throughout."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import orjson
from prometheus_client import REGISTRY

from app.main import create_app
from tests.e2e.server import running
from tests.ops.conftest import bearer, create_key, settings_with

# How long a test lets a misbehaving client go on before it calls the bound missing.
GIVE_UP_SECONDS = 30.0


def rejected(reason: str) -> float:
    return (
        REGISTRY.get_sample_value("compactd_http_requests_rejected_total", {"reason": reason})
        or 0.0
    )


@contextlib.contextmanager
def served(db_url: str, **changes: object) -> Iterator[int]:
    application = create_app(settings_with(**changes), database_url=db_url)
    with running(application) as base:
        yield int(base.rsplit(":", 1)[1])


def split_answer(answer: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


async def trickle_head(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes
) -> tuple[bytes, float]:
    """Send ``head`` a byte every 0.2 s (never its end) until the server answers or
    closes; gives what it sent back and how long that took."""
    started = time.perf_counter()
    # The first bytes of the answer (or the close) end the trickle: a byte sent after the
    # server has answered and closed would be met by a reset, which can discard the
    # answer before it is read.
    answer = asyncio.ensure_future(reader.read(65536))
    with contextlib.suppress(ConnectionError):
        for byte in head * 1000:
            if answer.done() or time.perf_counter() - started > GIVE_UP_SECONDS:
                break
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.wait({answer}, timeout=0.2)
    try:
        got = await asyncio.wait_for(answer, timeout=GIVE_UP_SECONDS)
    except ConnectionError:
        got = b""
    with contextlib.suppress(ConnectionError):
        if got:  # the rest of the answer, up to the close
            got += await asyncio.wait_for(reader.read(), timeout=GIVE_UP_SECONDS)
    return got, time.perf_counter() - started


async def healthy(port: int) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        r = await client.get("/healthz")
        assert r.status_code == 200, r.text


async def test_headers_trickled_a_byte_at_a_time_get_408_and_the_connection_closes(
    db_url: str,
) -> None:
    before = rejected("header_timeout")
    with served(db_url, header_timeout_seconds=1.0) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer, took = await trickle_head(
            reader, writer, b"GET /v1/sessions HTTP/1.1\r\nHost: compactd\r\nX-Slow: "
        )
        writer.close()
        print(f"\n[slow headers] answered and closed after {took:.2f} s (bound 1 s)")
        status, headers, body = split_answer(answer)
        assert status == b"HTTP/1.1 408 Request Timeout", answer
        assert headers[b"content-type"] == b"application/problem+json"
        assert headers[b"connection"] == b"close"
        problem = orjson.loads(body)
        assert problem["status"] == 408
        assert "did not arrive within 1 s" in problem["detail"]
        assert took < GIVE_UP_SECONDS  # it was the server that ended it
        assert rejected("header_timeout") == before + 1
        await healthy(port)


async def test_the_next_request_on_a_kept_alive_connection_has_the_same_bound(
    db_url: str,
) -> None:
    with served(db_url, header_timeout_seconds=1.0) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: compactd\r\n\r\n")
        first = await reader.readuntil(b'"ok"}')
        assert first.startswith(b"HTTP/1.1 200"), first
        answer, took = await trickle_head(reader, writer, b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        writer.close()
        print(f"\n[slow headers, 2nd request] closed after {took:.2f} s (bound 1 s)")
        assert answer.startswith(b"HTTP/1.1 408"), answer


async def test_a_connection_that_sends_nothing_is_closed(db_url: str) -> None:
    with served(db_url, header_timeout_seconds=1.0) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.perf_counter()
        got = await asyncio.wait_for(reader.read(), timeout=GIVE_UP_SECONDS)
        print(f"\n[idle connection] closed after {time.perf_counter() - started:.2f} s")
        writer.close()
        assert got == b""  # closed, with no answer to a request never made


def send_while_reading(port: int, head: bytes, rest: bytes) -> tuple[bytes, int, float]:
    """``head`` then ``rest`` (which the server may stop reading), sent while the answer
    is read; gives the answer (empty if the server's close reset the connection before
    it could be read), how many of ``rest``'s bytes went out, and the time taken."""
    sent = 0
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=GIVE_UP_SECONDS) as sock:
        sock.sendall(head)

        def send() -> None:
            nonlocal sent
            view = memoryview(rest)
            with contextlib.suppress(OSError):
                while sent < len(rest):
                    sent += sock.send(view[sent : sent + 65536])

        sender = threading.Thread(target=send)
        sender.start()
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass  # the server closed with the rest unread
        took = time.perf_counter() - started
    sender.join(timeout=GIVE_UP_SECONDS)
    return answer, sent, took


def send_huge_head(port: int, header_bytes: int) -> tuple[bytes, int, float]:
    """A request whose Authorization header is ``header_bytes`` long, sent while the
    answer is read; gives the answer (empty if the connection was reset before it
    could be read), how much of the request the server let in, and the time taken."""
    request = (
        b"GET /v1/sessions HTTP/1.1\r\nHost: compactd\r\nConnection: close\r\n"
        b"Authorization: Bearer " + b"a" * header_bytes + b"\r\n\r\n"
    )
    return send_while_reading(port, b"", request)


async def test_an_8_mb_authorization_header_is_refused_without_being_read_whole(
    db_url: str,
) -> None:
    key = await create_key(db_url, "tenant-a")
    before = rejected("header_too_large")
    huge = 8 * 1024 * 1024
    with served(db_url) as port:  # the default bound: 64 KiB
        answer, sent, took = await asyncio.to_thread(send_huge_head, port, huge)
        status_line = answer.split(b"\r\n", 1)[0]
        print(
            f"\n[huge header] {sent:,} of {huge:,} bytes went out before the server closed, "
            f"after {took:.2f} s; answer: {status_line!r}"
        )
        # A 431, or (when the close reset the connection before the answer was read)
        # nothing: never an answer to the request itself (the 401 of a bad key).
        assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:200]
        assert sent < huge  # the server stopped reading
        assert rejected("header_too_large") == before + 1
        # It still serves others, keys and all.
        await healthy(port)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            r = await client.get("/v1/sessions", headers=bearer(key))
            assert r.status_code == 200, r.text


async def test_headers_just_over_the_limit_get_a_431_problem(db_url: str) -> None:
    with served(db_url, max_header_bytes=16 * 1024) as port:
        # Sent in one go and read whole: the bound is exact for a head that ends.
        answer, _, _ = await asyncio.to_thread(send_huge_head, port, 17 * 1024)
        status, headers, body = split_answer(answer)
        assert status == b"HTTP/1.1 431 Request Header Fields Too Large", answer
        assert headers[b"content-type"] == b"application/problem+json"
        problem = orjson.loads(body)
        assert problem["status"] == 431
        assert "over the 16384-byte limit" in problem["detail"]
        # Under the limit, the same request is served (and refused for its key only).
        answer, _, _ = await asyncio.to_thread(send_huge_head, port, 15 * 1024)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


# ------------------------------------------------------------------ trailers


def chunked_append(session_id: str, body: bytes, trailer: bytes) -> bytes:
    """An append whose body is sent chunked, followed by ``trailer`` (complete lines)."""
    return (
        f"POST /v1/sessions/{session_id}/messages HTTP/1.1\r\nHost: compactd\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + (f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n" + trailer + b"\r\n")


async def exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=GIVE_UP_SECONDS)
    finally:
        writer.close()


def one_message(text: str) -> bytes:
    return orjson.dumps({"messages": [{"role": "user", "content": text}]})


async def test_trailers_never_reach_the_app_as_headers(db_url: str) -> None:
    """A chunked body's trailer fields are not headers: a proxy in front would not have
    seen them as such. Sent as trailers, `Idempotency-Key` and `If-Match` do nothing
    (the second append with the same key stored a second entry; a stale If-Match is
    not a 412)."""
    with served(db_url) as port:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            created = await client.post("/v1/sessions", json={"model": "gpt-4o"})
            assert created.status_code == 201, created.text
            sid = created.json()["id"]
            trailers = [
                b"Idempotency-Key: same\r\n",
                b"Idempotency-Key: same\r\n",
                b'If-Match: "999"\r\n',
            ]
            for n, trailer in enumerate(trailers):
                answer = await exchange(port, chunked_append(sid, one_message(f"m{n}"), trailer))
                status, _, body = split_answer(answer)
                assert status == b"HTTP/1.1 201 Created", answer[:300]
                assert len(orjson.loads(body)["entries"]) == 1
            # Framing is not body, yet a body of many tiny chunks (about 200 KB of framing
            # for 33 KB of body) and a small trailer are served as ever.
            body = one_message("x" * 33_000)
            request = chunked_append(sid, b"", b"X-Note: ok\r\n")
            head, _, _ = request.partition(b"\r\n\r\n")
            tiny_chunks = b"".join(b"1\r\n" + body[i : i + 1] + b"\r\n" for i in range(len(body)))
            answer = await exchange(
                port, head + b"\r\n\r\n" + tiny_chunks + b"0\r\nX-Note: ok\r\n\r\n"
            )
            assert answer.startswith(b"HTTP/1.1 201 Created"), answer[:300]
            history = await client.get(f"/v1/sessions/{sid}/messages")
            contents = [e["message"]["content"] for e in history.json()["entries"]]
            assert contents == ["m0", "m1", "m2", "x" * 33_000], history.text[:300]


async def test_a_huge_trailer_is_refused_without_being_read_whole(db_url: str) -> None:
    """Trailer bytes count against COMPACTD_MAX_HEADER_BYTES like the head's: a 50 MB
    trailer field, or 5,000 trailer fields of 1 KB, get 431 (or a closed connection)
    and store nothing (both were accepted, the second as 5,002 headers)."""
    cases = {
        "one 50 MB field": b"X-Big: " + b"a" * (50 * 1024 * 1024) + b"\r\n",
        "5,000 fields of 1 KB": b"".join(
            b"X-Field-%d: " % i + b"b" * 1024 + b"\r\n" for i in range(5000)
        ),
    }
    with served(db_url) as port:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            sid = (await client.post("/v1/sessions", json={"model": "gpt-4o"})).json()["id"]
            for name, fields in cases.items():
                before = rejected("trailer_too_large")
                whole = chunked_append(sid, one_message(name), b"")
                head_and_body = whole[: -len(b"\r\n")]  # the trailer's end comes after it
                answer, sent, took = await asyncio.to_thread(
                    send_while_reading, port, head_and_body, fields + b"\r\n"
                )
                status_line = answer.split(b"\r\n", 1)[0]
                print(
                    f"\n[huge trailer: {name}] {sent:,} of {len(fields):,} trailer bytes went "
                    f"out; answered {status_line!r} after {took:.2f} s"
                )
                assert (
                    answer == b"" or status_line == b"HTTP/1.1 431 Request Header Fields Too Large"
                ), answer[:300]
                if answer:
                    assert b"over the 65536-byte limit" in answer, answer[:600]
                if len(fields) > 10 * 1024 * 1024:
                    assert sent < len(fields)  # the server stopped reading
                assert rejected("trailer_too_large") == before + 1
            history = await client.get(f"/v1/sessions/{sid}/messages")
            assert history.json()["entries"] == []
        await healthy(port)
