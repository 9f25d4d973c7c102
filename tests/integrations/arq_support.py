"""Running a real arq worker in this process, on the test Redis, with a queue of its own."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.jobs import Job
from arq.worker import Worker

from tests.integrations.celery_support import redis_url


@dataclass
class Queue:
    """One test's queue: its name, the Redis it lives on, and the job ids it saw."""

    url: str
    name: str = field(default_factory=lambda: f"co-arq-{os.urandom(4).hex()}")
    job_ids: list[str] = field(default_factory=list)

    @property
    def redis_settings(self) -> RedisSettings:
        return RedisSettings.from_dsn(self.url)

    def settings(self, functions: Sequence[Any], **extra: Any) -> dict[str, Any]:
        """``Worker`` keywords for a burst worker on this queue (what ``install`` configures)."""
        return {
            "functions": list(functions),
            "queue_name": self.name,
            "redis_settings": self.redis_settings,
            **extra,
        }

    async def pool(self) -> ArqRedis:
        return await create_pool(self.redis_settings, default_queue_name=self.name)

    async def enqueue(self, pool: ArqRedis, function: str, *args: Any, **kwargs: Any) -> Job:
        job = await pool.enqueue_job(function, *args, _queue_name=self.name, **kwargs)
        assert job is not None
        self.job_ids.append(job.job_id)
        return job


async def burst(settings: dict[str, Any]) -> Worker:
    """Run a worker on ``settings`` until its queue is empty (retries and follow-ups included)."""
    options = {
        "burst": True,
        "handle_signals": False,
        "poll_delay": 0.05,
        "keep_result": 600,
        **settings,
    }
    worker = Worker(**options)
    try:
        await worker.async_run()
    finally:
        await worker.close()
    return worker


@contextmanager
def queue() -> Iterator[Queue]:
    """A fresh queue on the test Redis; its keys and its jobs' keys are removed afterwards."""
    import redis

    with redis_url() as url:
        made = Queue(url)
        try:
            yield made
        finally:
            client = redis.Redis.from_url(url)
            try:
                names = list(client.scan_iter(match=f"*{made.name}*", count=500))
                for job_id in made.job_ids:
                    names += list(client.scan_iter(match=f"arq:*{job_id}*", count=500))
                if names:
                    client.delete(*names)
            finally:
                client.close()
