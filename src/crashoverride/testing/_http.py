"""HTTP plumbing of ``MockServer``: a threaded stdlib server that can drop its connections.

The stdlib server, not an ASGI one: a hang fault is then just a blocked handler thread,
startup needs no event loop (sync, asyncio and trio tests use it alike), and closing never
waits for a client that went away.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from crashoverride.testing._chat import error_body, sse_events
from crashoverride.testing._steps import Fault

if TYPE_CHECKING:
    from crashoverride.testing._server import MockServer


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    """One request the server received, in arrival order."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or []) if isinstance(self.body, dict) else []


@dataclass(frozen=True, slots=True)
class Reply:
    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    completion: dict[str, Any] | None = None  # streamed or sent as JSON, as the client asked
    fault: Fault | None = None


class ServerThread(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # close() must not wait for a client that hung up mid-hang
    mock: MockServer

    def __init__(self, address: tuple[str, int]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """End idle keep-alive connections so their threads exit and close their sockets."""
        with self._open_lock:
            sockets = list(self._open)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that give up (timeouts, cancelled recoveries) are expected here, not errors.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
    server: ServerThread

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests assert on ``requests``, not on stderr noise

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {name.lower(): value for name, value in self.headers.items()}
        request = ReceivedRequest("POST", self.path, headers, body)
        reply = self.server.mock._receive(request)
        try:
            self._send(reply, request)
        except OSError:
            self.close_connection = True  # the client went away; nothing left to tell it

    def do_GET(self) -> None:
        self._send_bytes(404, error_body("the mock serves POST /v1/chat/completions"), ())

    def _send(self, reply: Reply, request: ReceivedRequest) -> None:
        fault = reply.fault
        if fault is not None and fault.kind == "hang":
            mock = self.server.mock
            seconds = fault.seconds if fault.seconds is not None else mock._max_hang
            mock._release.wait(min(seconds, mock._max_hang))
            self.close_connection = True
            return
        if fault is not None and fault.kind == "malformed":
            if request.stream:
                self._send_stream([b'data: {"id": "chatcmpl-broken", "choices": [\n\n'])
            else:
                self._send_bytes(200, b'{"id": "chatcmpl-broken", "choices": [', ())
            return
        if reply.completion is None:
            self._send_bytes(reply.status, reply.body, reply.headers)
        elif request.stream:
            options = request.body.get("stream_options") or {}
            usage = bool(isinstance(options, dict) and options.get("include_usage"))
            self._send_stream(sse_events(reply.completion, include_usage=usage))
        else:
            self._send_bytes(200, json.dumps(reply.completion).encode(), ())

    def _connection_header(self) -> None:
        if not self.server.mock.keep_alive:
            self.send_header("Connection", "close")
            self.close_connection = True

    def _send_bytes(self, status: int, body: bytes, headers: tuple[tuple[str, str], ...]) -> None:
        self.send_response(status)
        self._connection_header()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def _send_stream(self, events: Any) -> None:
        self.send_response(200)
        self._connection_header()
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events:
            self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
