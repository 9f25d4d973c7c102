"""``MockServer``: an OpenAI-compatible chat-completions endpoint on loopback, for wire tests.

It runs in a daemon thread (see ``_http``), so sync, asyncio and trio tests use it alike.

Three modes, chosen by the arguments: a *script* (steps from ``_steps``, faults included), a
*cassette* replay, or *recording*: a proxy to a real endpoint that stores every exchange.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any

from crashoverride.testing._cassette import Cassette, CassetteError, make_scrubber
from crashoverride.testing._chat import completion_for_turn, decisive, error_body
from crashoverride.testing._http import ReceivedRequest, Reply, ServerThread
from crashoverride.testing._steps import Script, StepLike, Turn, as_script

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_NO_RETRY = (("x-should-retry", "false"),)  # the openai client honours it: a miss is final


class MockServer:
    """An OpenAI-compatible server on loopback; use as ``with`` or ``async with``.

    Args:
        script: A ``Script`` or the steps of one run (script mode).
        cassette: A ``Cassette`` or a path to replay (replay mode).
        upstream: Base URL of a real endpoint to proxy to and record (recording mode).
        upstream_api_key: Key for the upstream; default: the client's own bearer token.
        record_to: Where recording mode saves the cassette (after every exchange).
        host: A loopback address; anything else is refused.
        port: 0 picks a free port.
        max_hang: Upper bound of a hang fault, so a forgotten hang cannot wedge a test run.
        upstream_timeout: Seconds to wait for the upstream in recording mode.
        keep_alive: Keep connections open between requests. Off by default: a client that is
            never closed (its event loop ended first) then holds no live socket, so tests get
            no ResourceWarning or "Event loop is closed" error at garbage collection.
    """

    def __init__(
        self,
        script: Script | list[StepLike] | tuple[StepLike, ...] | None = None,
        *,
        cassette: Cassette | str | Path | None = None,
        upstream: str | None = None,
        upstream_api_key: str | None = None,
        record_to: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_hang: float = 60.0,
        upstream_timeout: float = 120.0,
        keep_alive: bool = False,
    ) -> None:
        if host not in _LOOPBACK:
            raise ValueError(f"MockServer binds to loopback only, not {host!r}")
        if sum(x is not None for x in (script, cassette, upstream)) > 1:
            raise ValueError("choose one of script=, cassette= or upstream=")
        if upstream is not None:
            self.mode = "record"
            self.cassette: Cassette | None = Cassette(path=record_to)
        elif cassette is not None:
            self.mode = "replay"
            self.cassette = cassette if isinstance(cassette, Cassette) else Cassette.load(cassette)
        else:
            self.mode = "script"
            self.cassette = None
        self.upstream = upstream.rstrip("/") if upstream is not None else None
        self._upstream_key = upstream_api_key
        self._upstream_timeout = upstream_timeout
        self._host, self._port, self._max_hang = host, port, max_hang
        self.keep_alive = keep_alive
        self._lock = threading.Lock()
        self._turns: deque[Turn] = deque(as_script(script).turns())
        self._fault_uses = 0
        self._requests: list[ReceivedRequest] = []
        self._turn = 0
        self.errors: list[str] = []
        self._release = threading.Event()
        self._httpd: ServerThread | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> MockServer:
        if self._httpd is not None:
            return self
        self._release.clear()
        httpd = ServerThread((self._host, self._port))
        httpd.mock = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
            name="crashoverride-mock-server", daemon=True,
        )  # fmt: skip
        self._thread.start()
        return self

    def close(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._release.set()  # wake hung handlers: they close their connection unanswered
        httpd.shutdown()
        httpd.drop_connections()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)
        if self.mode == "record" and self.cassette is not None and self.cassette.path:
            self.cassette.save()

    def __enter__(self) -> MockServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    async def __aenter__(self) -> MockServer:
        return self.start()

    async def __aexit__(self, *_: object) -> None:
        from crashoverride._placement.waiting import in_daemon_thread

        # shutdown() waits for the serve loop's next poll: keep that off the event loop.
        await in_daemon_thread(self.close)

    # -- what tests use --------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the server is not running: use it as a context manager")
        address, port = self._httpd.server_address[:2]
        host = address.decode() if isinstance(address, bytes) else str(address)
        return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._lock:
            return list(self._requests)

    def serve(self, script: Script | list[StepLike] | tuple[StepLike, ...]) -> None:
        """Append the turns of ``script`` to what the server will answer (script mode)."""
        with self._lock:
            self._turns.extend(as_script(script).turns())

    @property
    def remaining_turns(self) -> int:
        with self._lock:
            return sum(1 for turn in self._turns if turn.fault is None or turn.fault.times)

    def crash_override(self, **settings: Any) -> Any:
        """A ``CrashOverride`` talking to this server (``model`` defaults to the recorded one)."""
        from crashoverride._app import CrashOverride

        settings.setdefault("base_url", self.base_url)
        settings.setdefault("api_key", "test")
        if "model" not in settings:
            settings["model"] = self._default_model()
        return CrashOverride(**settings)

    def assert_complete(self) -> None:
        """Fail if the server reported errors or scripted turns were never asked for."""
        problems = list(self.errors)
        left = [turn for turn in self._turns if turn.fault is None or turn.fault.times]
        if self.mode == "script" and left:
            problems.append(f"{len(left)} scripted turn(s) were never requested")
        if self.mode == "replay" and self.cassette is not None and self._turn < len(self.cassette):
            problems.append(f"only {self._turn} of {len(self.cassette)} cassette turns replayed")
        if problems:
            raise AssertionError("; ".join(problems))

    def _default_model(self) -> str:
        if self.mode == "replay" and self.cassette is not None and self.cassette.interactions:
            return str(self.cassette.interactions[0]["request"].get("model") or "scripted")
        return "scripted"

    # -- answering (handler threads) -------------------------------------------------------

    def _receive(self, request: ReceivedRequest) -> Reply:
        with self._lock:
            self._requests.append(request)
            self._turn += 1
            turn_number = self._turn
        if not request.path.rstrip("/").endswith("/chat/completions"):
            return Reply(
                404, error_body(f"the mock serves /v1/chat/completions, not {request.path}")
            )
        if not isinstance(request.body, dict) or "messages" not in request.body:
            return self._miss(turn_number, "the body is not a chat-completions request", 400)
        if self.mode == "record":
            return self._forward(request.body, request.headers)
        if self.mode == "replay":
            assert self.cassette is not None
            try:
                completion = self.cassette.response_for(turn_number, request.body, make_scrubber())
            except CassetteError as exc:
                return self._miss(turn_number, str(exc), 400)
            return Reply(completion=completion)
        return self._scripted(turn_number, request.body)

    def _scripted(self, number: int, body: dict[str, Any]) -> Reply:
        with self._lock:
            turn = self._next_turn()
        if turn is None:
            return self._miss(number, f"request {number}: the script has no turn left", 400)
        if turn.fault is not None:
            fault = turn.fault
            if fault.kind == "status":
                return Reply(fault.status, fault.body.encode(), fault.headers)
            return Reply(fault=fault)
        return Reply(completion=completion_for_turn(turn, body, number))

    def _next_turn(self) -> Turn | None:
        if not self._turns:
            return None
        turn = self._turns[0]
        fault = turn.fault
        if fault is not None:
            if fault.times is None:
                return turn  # answers every remaining request
            if self._fault_uses + 1 < fault.times:
                self._fault_uses += 1
                return turn
        self._fault_uses = 0
        return self._turns.popleft()

    def _miss(self, number: int, message: str, status: int) -> Reply:
        # Never a made-up completion: the client gets an error, the test gets the reason.
        with self._lock:
            self.errors.append(message)
        return Reply(status, error_body(message), _NO_RETRY)

    def _forward(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        token = headers.get("authorization", "").removeprefix("Bearer ").strip()
        key = self._upstream_key or token
        # Ask the upstream for a whole completion whatever the client asked: the cassette
        # then serves streaming and non-streaming replays alike.
        upstream_body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        outgoing = urllib.request.Request(
            f"{self.upstream}/chat/completions",
            data=json.dumps(upstream_body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(outgoing, timeout=self._upstream_timeout) as answer:
                completion = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            # Upstream errors pass through (with Retry-After) and are not recorded.
            passed = tuple(
                (name, value) for name, value in exc.headers.items()
                if name.lower() in ("retry-after", "retry-after-ms", "x-should-retry")
            )  # fmt: skip
            return Reply(exc.code, exc.read(), passed)
        except (OSError, ValueError) as exc:
            return Reply(502, error_body(f"upstream failed: {exc}", "upstream_error"))
        assert self.cassette is not None
        with self._lock:
            scrub = make_scrubber([key, token])
            self.cassette.record(scrub(decisive(body)), scrub(completion))
            if self.cassette.path is not None:
                self.cassette.save()
        return Reply(completion=completion)
