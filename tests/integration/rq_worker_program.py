"""An RQ worker started by the application's own script, the jobs' module imported first.

    python rq_worker_program.py REDIS_URL QUEUE WORKER_CLASS

Imports ``traced_jobs`` (so ``configure()`` runs in the worker's own process, before any work
horse is forked from it), then works the queue in burst mode with ``rq.worker.WORKER_CLASS``.
"""

from __future__ import annotations

import sys

import traced_jobs  # noqa: F401  (configures the tracer in this process)
from redis import Redis
from rq import Queue, worker


def main() -> None:
    url, name, worker_class = sys.argv[1], sys.argv[2], sys.argv[3]
    connection = Redis.from_url(url)
    queue = Queue(name, connection=connection)
    getattr(worker, worker_class)([queue], connection=connection).work(burst=True)


if __name__ == "__main__":
    main()
