"""The door of tritonserver's HTTP and metrics ports: a thin HTTP/1.1 guard that bounds each request before Triton
reads it.

tritonserver 2.51 has no flag that bounds an HTTP request, and two kinds of request end the whole server with
SIGSEGV, both by overflowing the stack of one of its HTTP threads (8 MiB, from RLIMIT_STACK; 2 MiB when that is
unlimited): a body sent as application/x-www-form-urlencoded (what `curl -d` sends), which libevhtp decodes into
two arrays on the stack as long as the body (a 4.2 MB body ends it), and JSON nested about 100,000 levels deep
(a 300 KB body of `[`), which rapidjson parses recursively, plain or gzip-compressed. `serve` therefore starts
Triton's HTTP and metrics listeners on loopback ports and this guard on the public ones (a thread of `serve`), and
so does deploy/launch_trtllm.sh in NVIDIA's container (`python -m trtllm_model.launch.http_guard`, a process beside
tritonserver). The guard reads each request's head and body, refuses one over the bounds below with a JSON error
(`{"error": ...}`, as Triton's own) and closes that connection, and passes every other request through unchanged;
the responses come back byte for byte, streams as they are sent. gRPC does not pass here: Triton reads it with
gRPC's own parser, and the model refuses each input over its bound (docs/security.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import socket
import sys
import threading
import zlib
from dataclasses import dataclass

import numpy as np

from ..pipeline.request_checks import MAX_GUIDE_BYTES
from ..server import LOOPBACK

# Request line and headers together. Longer than any header a client of this server sends (the admin key, a
# trace context), and bounds the query string libevhtp decodes on the stack the same way as a form body.
MAX_HEAD_BYTES = 64 << 10
# The largest body the model can take over JSON: a guided-decoding guide at its bound (1 MiB), escaped, beside
# the other fields (a prompt at max_input_len is at most 512 KiB). Half of it is what libevhtp puts on a thread's
# 8 MiB stack for a form body. Larger requests (LoRA weights) go over gRPC.
MAX_BODY_BYTES = 2 * MAX_GUIDE_BYTES
# Triton's requests nest 4 levels (a tensor's data 1 more per dimension); rapidjson overflows past about 100,000.
MAX_JSON_DEPTH = 64
# Bodies up to this size are checked on the event loop's thread (microseconds); larger ones on a worker thread, as
# scanning 2 MiB of brackets for their depth takes tens of milliseconds.
INLINE_CHECK_BYTES = 64 << 10
# A refused body still being sent is read and dropped for this long (so that the client reads the refusal instead
# of a reset), then the connection closes.
DRAIN_S = 10.0

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_STEPS = np.zeros(256, np.int32)  # what each byte does to the nesting depth
_STEPS[[ord("["), ord("{")]] = 1
_STEPS[[ord("]"), ord("}")]] = -1
_DECOMPRESSION = {"gzip": 31, "deflate": 15}  # zlib window bits: gzip and zlib framing, as Triton reads them
_REASONS = {400: "Bad Request", 411: "Length Required", 413: "Content Too Large", 415: "Unsupported Media Type",
            431: "Request Header Fields Too Large", 503: "Service Unavailable"}


class Refusal(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def response(self) -> bytes:
        body = json.dumps({"error": str(self)}).encode()
        return (f"HTTP/1.1 {self.status} {_REASONS[self.status]}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


@dataclass
class RequestHead:
    raw: bytes  # as it is forwarded (without an Expect: 100-continue, which the guard answers itself)
    content_length: int
    content_encoding: str
    json_length: int | None  # Inference-Header-Content-Length: the JSON part of a body with binary tensors
    expects_continue: bool


def parse_head(head: bytes) -> RequestHead:
    """The request's framing from its head (request line and headers, ending in an empty line); Refusal for a head
    Triton could read differently from this guard, for a chunked body and for a body over MAX_BODY_BYTES."""
    lines = head[:-4].split(b"\r\n")
    request_line = lines[0].split(b" ")
    if (len(request_line) != 3 or not _TOKEN.fullmatch(request_line[0]) or not _TARGET.fullmatch(request_line[1])
            or not request_line[2].startswith(b"HTTP/1.")):
        raise Refusal(400, "malformed request line")
    fields: dict[str, list[str]] = {}
    kept = [lines[0]]
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name) or _CONTROL.search(value):
            raise Refusal(400, "malformed header line")  # folded, bare CR/LF, a space before the colon
        key = name.decode().lower()
        fields.setdefault(key, []).append(value.strip(b" \t").decode("latin-1"))
        if key != "expect":
            kept.append(line)
    if "transfer-encoding" in fields:
        raise Refusal(411, "a chunked request body is not accepted: send it with a Content-Length")
    content_length = _single_number(fields, "content-length", 0)
    if content_length > MAX_BODY_BYTES:
        raise Refusal(413, f"request body of {content_length} bytes is over this server's {MAX_BODY_BYTES} "
                           "(HTTP); send larger requests over gRPC")
    encoding = _single(fields, "content-encoding", "identity").lower()
    if encoding not in ("identity", *_DECOMPRESSION):
        raise Refusal(415, f"Content-Encoding {encoding!r}: only identity, gzip and deflate")
    expects_continue = any(value.lower() == "100-continue" for value in fields.get("expect", ()))
    raw = b"\r\n".join(kept) + b"\r\n\r\n" if expects_continue else head
    return RequestHead(raw, content_length, encoding, _single_number(fields, "inference-header-content-length", None),
                       expects_continue)


def check_body(request: RequestHead, body: bytes) -> None:
    """Refusal for a body Triton could not parse without overflowing a stack: JSON (decompressed, the part before
    any binary tensors) nested deeper than MAX_JSON_DEPTH, or decompressing past MAX_BODY_BYTES."""
    content = body
    if request.content_encoding in _DECOMPRESSION:
        decompressor = zlib.decompressobj(_DECOMPRESSION[request.content_encoding])
        try:
            content = decompressor.decompress(body, MAX_BODY_BYTES + 1)
        except zlib.error as error:
            raise Refusal(400, f"the body is not valid {request.content_encoding} data: {error}") from None
        if len(content) > MAX_BODY_BYTES or decompressor.unconsumed_tail:
            raise Refusal(413, f"the body decompresses to more than this server's {MAX_BODY_BYTES} bytes (HTTP); "
                               "send larger requests over gRPC")
    if request.json_length is not None and 0 < request.json_length <= len(content):
        content = content[:request.json_length]
    if nested_deeper_than(content, MAX_JSON_DEPTH):
        raise Refusal(400, f"the request's JSON nests deeper than {MAX_JSON_DEPTH} levels")


def nested_deeper_than(data: bytes, limit: int) -> bool:
    """Whether JSON `data` opens more than `limit` arrays and objects at once, brackets inside strings not counted.

    Exact for valid JSON; past a syntax error, where rapidjson stops, it may count more, never less. Vectorized, so
    that a 2 MiB body of brackets costs milliseconds, not a Python loop or a regex match per string."""
    if data.count(b"[") + data.count(b"{") <= limit:  # almost every request: nothing to scan
        return False
    chars = np.frombuffer(data, np.uint8)
    steps = _STEPS[chars]
    quotes = np.flatnonzero(chars == ord('"'))
    if quotes.size:
        # A quote is escaped when an odd number of backslashes runs right before it; the others open or close a
        # string, and the bytes from an opening quote to its closing one are not brackets.
        positions = np.arange(chars.size, dtype=np.int32)
        last_other = np.maximum.accumulate(np.where(chars == ord("\\"), -1, positions))
        before = np.where(quotes > 0, last_other[np.maximum(quotes - 1, 0)], -1)
        toggles = np.zeros(chars.size, np.int8)
        toggles[quotes[(quotes - 1 - before) % 2 == 0]] = 1
        steps[(np.cumsum(toggles, dtype=np.int32) & 1).astype(bool)] = 0
    return int(np.cumsum(steps, dtype=np.int32).max()) > limit


def _single(fields: dict[str, list[str]], name: str, default: str) -> str:
    values = fields.get(name, [default])
    if len(values) != 1:
        raise Refusal(400, f"{len(values)} {name} headers")
    return values[0]


def _single_number(fields: dict[str, list[str]], name: str, default: int | None) -> int | None:
    value = _single(fields, name, "")
    if not value:
        return default
    if not value.isdigit() or not value.isascii():
        raise Refusal(400, f"{name}: {value[:40]!r} is not a byte count")
    return int(value)


@dataclass
class Route:
    listen_host: str
    listen_port: int
    upstream_port: int  # on LOOPBACK


class HttpGuard:
    """The guard's listeners and its event loop, on a daemon thread of the process that started it."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes
        # Bound here, in the caller's thread, so that a port in use fails the start, not the thread.
        self._sockets = [socket.create_server((route.listen_host, route.listen_port),
                                              family=socket.AF_INET6 if ":" in route.listen_host else socket.AF_INET)
                         for route in routes]
        self._loop = _new_event_loop()
        self._thread = threading.Thread(target=self._run, name="http-guard", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        for route, sock in zip(self.routes, self._sockets):
            handler = lambda reader, writer, port=route.upstream_port: _serve_connection(reader, writer, port)  # noqa: E731
            self._loop.run_until_complete(asyncio.start_server(handler, sock=sock, limit=MAX_HEAD_BYTES))
        self._loop.run_forever()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        for sock in self._sockets:
            sock.close()


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def _serve_connection(client: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                            upstream_port: int) -> None:
    """Requests of one client connection, each checked and then written to one upstream connection, whose bytes a
    pump copies back. A refusal answers at once and closes both (a client that pipelines requests may see it
    before the end of an earlier response, on its own connection)."""
    upstream_writer = pump = None
    try:
        while True:
            try:
                request = parse_head(await client.readuntil(b"\r\n\r\n"))
            except asyncio.IncompleteReadError:
                return  # the client closed
            except asyncio.LimitOverrunError:
                raise Refusal(431, f"request head (request line and headers) over {MAX_HEAD_BYTES} bytes") from None
            if request.expects_continue and request.content_length:
                client_writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                body = await client.readexactly(request.content_length)
            except asyncio.IncompleteReadError:
                return
            if len(body) > INLINE_CHECK_BYTES:  # off the loop: the other connections go on meanwhile
                await asyncio.get_running_loop().run_in_executor(None, check_body, request, body)
            else:
                check_body(request, body)
            if upstream_writer is None:
                try:
                    upstream, upstream_writer = await asyncio.open_connection(LOOPBACK, upstream_port)
                except OSError:
                    raise Refusal(503, "tritonserver is not accepting connections (starting or stopping)") from None
                pump = asyncio.ensure_future(_pump(upstream, client_writer))
                pump.add_done_callback(lambda _: client_writer.close())
            upstream_writer.write(request.raw + body)
            await upstream_writer.drain()
    except Refusal as refusal:
        client_writer.write(refusal.response())
        with contextlib.suppress(ConnectionError):
            await client_writer.drain()
            await _drain(client)
    except ConnectionError:
        pass
    finally:
        if pump is not None:
            pump.cancel()
        if upstream_writer is not None:
            upstream_writer.close()
        client_writer.close()


async def _pump(upstream: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await upstream.read(1 << 16):
            client_writer.write(data)
            await client_writer.drain()


async def _drain(client: asyncio.StreamReader) -> None:
    """Read and drop what the client still sends, for up to DRAIN_S."""
    with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
        async with asyncio.timeout(DRAIN_S):
            while await client.read(1 << 20):
                pass


def main(argv: list[str] | None = None) -> int:
    """The guard as a process of its own, for a tritonserver started without `serve`: it serves until SIGTERM (or
    Ctrl-C, where its parent did not turn that off) and then exits 0; a port it cannot take exits 1 at once."""
    parser = argparse.ArgumentParser(
        prog="python -m trtllm_model.launch.http_guard",
        description="Bound every HTTP request on PORT before tritonserver, listening on UPSTREAM_PORT on "
                    f"{LOOPBACK}, reads it; pass the rest through unchanged.")
    parser.add_argument("--host", default="0.0.0.0", help="the address the public ports are taken on (0.0.0.0)")
    parser.add_argument("--route", action="append", required=True, type=_route_ports, metavar="PORT=UPSTREAM_PORT",
                        help="a public port and tritonserver's loopback port behind it (repeat for each)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # a background job of a shell ignores it: keep that
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        guard = HttpGuard([Route(args.host, port, upstream) for port, upstream in args.route])
    except OSError as error:
        print(f"http_guard: cannot listen on {args.host}: {error}", file=sys.stderr)
        return 1
    stop.wait()
    guard.close()
    return 0


def _route_ports(text: str) -> tuple[int, int]:
    port, equals, upstream = text.partition("=")
    if not equals or not port.isdigit() or not upstream.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected PORT=UPSTREAM_PORT")
    return int(port), int(upstream)


if __name__ == "__main__":
    sys.exit(main())
