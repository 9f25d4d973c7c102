"""``crashoverride demo --scene redelivery``: a Celery worker is killed right after a charge.

A shop's ``checkout`` task charges a card, then renders the receipt. Worker 1 takes the task
(``acks_late``: the message stays unacknowledged until the task ends) and is killed with SIGKILL
right after the charge. Redis delivers the task again, to worker 2. With the charge declared
(``co.effect``), worker 2's run finds in the journal (in Redis) that this task's charge was done
and gets the receipt back without charging; the receipt template turns out to be renamed, the
(scripted) agent restores it and runs the task again, which finds the charge again: one charge.
The same shop without the declaration charges the card three times.

Real worker processes, a real Redis (broker, result backend, journal, and the "card processor",
a Redis list); only the model is scripted. The workers run the shop,
``crashoverride._cli.redelivery_worker``, configured by the environment this driver gives them
(``SCENE_*``). ``examples/celery_redelivery.py`` runs one variant at a time (``run``), a third
among them: worker 1 killed inside the charge, which its probe settles.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

DEFAULT_URL = "redis://127.0.0.1:6379/11"
ORDER = 7

Claim = tuple[str, bool, str]


# ------------------------------------------------------------------------- what it needs


def missing(url: str) -> str:
    """What this scene lacks to run here, said as what to do about it; "" when nothing."""
    needs = []
    for module, package in (("celery", "celery"), ("redis", "redis")):
        try:
            __import__(module)
        except ImportError:
            needs.append(package)
    if needs:
        return (
            f"The redelivery scene needs {' and '.join(needs)}, which are not installed here: "
            "pip install 'crashoverride[demo,celery]' (in a checkout: make demo-redelivery)."
        )
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    if not _answers(host, port):
        return (
            f"The redelivery scene needs a Redis and none answers at {host}:{port}. Start one "
            "(e.g. `redis-server --port 6379 --save ''`, `apt-get install redis-server`, or "
            "`docker run -p 6379:6379 redis`), or point REDIS_URL at yours "
            f"(default {DEFAULT_URL}; the scene uses keys of its own and removes them)."
        )
    return ""


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0) as conn:
            conn.sendall(b"PING\r\n")
            reply = conn.recv(64)
    except OSError:
        return False
    # +PONG, or -NOAUTH when a password is needed (REDIS_URL carries it): either way, a Redis.
    return reply.startswith((b"+PONG", b"-NOAUTH"))


# ------------------------------------------------------------------------ the scene (driver)


def scene(url: str) -> list[Claim]:
    """Both variants: the charge declared (charged once), then not (charged again)."""
    claims: list[Claim] = []
    for declared in (True, False):
        label = "with co.effect" if declared else "without co.effect"
        print(f"    -- {label}")
        answer, charges, log = run(url, declared=declared)
        print(f"    the card was charged {charges} time(s)")
        if declared:
            claims += [
                ("worker 2 answered the redelivered task",
                 answer == f"order {ORDER} paid, receipt ch_1", answer),
                ("with co.effect the card was charged once", charges == 1, f"{charges}"),
                ("the redelivery and the agent's rerun found the journaled charge",
                 log.count("effect.replayed") == 2, f"{log.count('effect.replayed')} replays"),
            ]  # fmt: skip
        else:
            claims.append(
                ("without co.effect the redelivery charged the card again (the duplicate)",
                 charges > 1, f"{charges}"),
            )  # fmt: skip
    return claims


def run(url: str, *, declared: bool, kill_at: str = "after") -> tuple[str, int, str]:
    """One checkout whose first worker is killed right after the charge (``kill_at="after"``)
    or inside it (``"inside"``): the answer, the charges, worker 2's log."""
    import redis
    from celery import Celery

    namespace = f"crashoverride-demo-shop-{os.urandom(4).hex()}"
    env = {"REDIS_URL": url, "SCENE_NS": namespace, "SCENE_DECLARED": "1" if declared else "0"}
    # Only sends the task and reads its result: the workers run the shop.
    sender = Celery("shop", broker=url, backend=url)
    card = redis.Redis.from_url(url, decode_responses=True)
    try:
        with _worker({**env, "SCENE_KILL_AT": kill_at}) as (first, _):
            sent = sender.send_task("shop.checkout", args=(ORDER,), queue=namespace)
            deadline = time.monotonic() + 120
            while card.get(f"{namespace}:worker-1") is None:
                if time.monotonic() > deadline or first.poll() is not None:
                    raise RuntimeError("worker 1 never charged the card")
                time.sleep(0.05)
            first.send_signal(signal.SIGKILL)
            first.wait(30)
            when = "inside the charge" if kill_at == "inside" else "right after the charge"
            print(f"    worker 1 was killed with SIGKILL {when}, before it acknowledged the task")
            with _worker(env) as (_, log):
                answer = str(sent.get(timeout=180))
                print(f"    worker 2 got the redelivery: {answer!r}")
                log.seek(0)
                text = log.read().decode(errors="replace")
        charges = int(card.llen(f"{namespace}:charges"))
    finally:
        for name in card.scan_iter(match=f"*{namespace}*"):  # queue, journal, charges, ...
            card.delete(name)
        card.close()
        sender.close()
    return answer, charges, text


@contextlib.contextmanager
def _worker(env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], Any]]:
    command = [sys.executable, "-m", "celery", "-A", "crashoverride._cli.redelivery_worker",
               "worker", "--pool=solo", "--without-heartbeat", "--without-gossip",
               "--without-mingle", "--loglevel=WARNING", "-Q", env["SCENE_NS"]]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield process, log
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(30)
