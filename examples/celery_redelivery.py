"""A Celery worker is killed (SIGKILL) right after it charged a card; the task is redelivered to
another worker, which recovers it, and the card was charged once.

The shop is the one `crashoverride demo --scene redelivery` runs, shipped in the package:
`crashoverride/_cli/redelivery_worker.py` (shown in docs/guides/demo.md). `checkout` charges
the order, then sends the receipt. Worker 1 takes the task (`acks_late`: the message stays
unacknowledged until the task ends) and is killed after the charge. Worker 2 gets the
redelivery. Its run of `checkout` calls `charge` again, and finds in the journal (in Redis,
through `RedisCoordination`) that this task id's charge was done: it gets the receipt back
without charging. Then the receipt template turns out to be renamed; the recovery agent repairs
it and runs the task body again (`rerun()`), which finds the charge again.

    python examples/celery_redelivery.py               # the charge declared with co.effect
    python examples/celery_redelivery.py --undeclared  # the same shop without it: 3 charges
    python examples/celery_redelivery.py --mid-charge  # killed inside the charge: the probe

`--mid-charge` kills worker 1 while the charge is under way (the processor took it, the call
never returned): the journal says "started", and worker 2 asks the processor (`probe=`) instead
of charging blind; without a probe the redelivery would fail with `EffectUncertain`.

Real worker processes, a real Redis (broker, result backend, journal, and the "card processor",
a Redis list); only the model is scripted. Needs Celery and a Redis: `REDIS_URL` (default
redis://127.0.0.1:6379/11). Everything it writes is under a fresh namespace, removed at the end.
Worker 2's log (its structlog events: `effect.replayed`, `effect.probed`...) goes to stderr.
This program only chooses the variant: the scene's driver (`crashoverride._cli.redelivery`,
private) starts, kills and counts, so the demo and this example cannot drift apart.
"""

from __future__ import annotations

import os
import sys

from crashoverride._cli import redelivery


def main() -> int:
    url = os.environ.get("REDIS_URL", redelivery.DEFAULT_URL)
    lacking = redelivery.missing(url)
    if lacking:
        print(lacking, file=sys.stderr)
        return 2
    declared = "--undeclared" not in sys.argv
    kill_at = "inside" if "--mid-charge" in sys.argv else "after"
    _, charges, log = redelivery.run(url, declared=declared, kill_at=kill_at)
    sys.stderr.write(log)
    print(f"the card was charged {charges} time(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
