"""The Celery processes the integration tests and the benchmarks start, and how they are stopped."""

import os
import signal
import subprocess
import sys
from pathlib import Path

WORKER = [
    "worker",
    "--pool",
    "solo",
    "--queues",
    "default,chain,provisioning",
    "--without-heartbeat",
    "--without-mingle",
    "--without-gossip",
]


def process_env_for_tests(**extra_env: str) -> dict[str, str]:
    """The environment of a process that works on the test database and the test Redis."""
    from django.db import connection

    db = connection.settings_dict
    return {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": os.environ["REDIS_URL"],
        "DEBUG": "1",
        **extra_env,
    }


def celery_argv(*args: str, loglevel: str = "WARNING") -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "portal", *args, "--loglevel", loglevel]


def worker_argv(loglevel: str = "WARNING", include: tuple[str, ...] = ()) -> list[str]:
    """A worker on every queue, one task at a time (with the tasks of `include`'s modules too)."""
    return celery_argv(*WORKER, *(["--include", ",".join(include)] if include else []), loglevel=loglevel)


def beat_argv(schedule: Path, loglevel: str = "WARNING") -> list[str]:
    return celery_argv("beat", "--schedule", str(schedule), loglevel=loglevel)


def stop_process_groups(processes: list[subprocess.Popen], timeout: float = 20, *, whole_group: bool = True) -> None:
    """SIGTERM to each process group still running, then SIGKILL to those not gone after `timeout` seconds.

    `whole_group=False` sends the SIGTERM to the leader alone: gunicorn and a prefork Celery worker stop their
    own children, and a worker whose pool is killed under it starts new children rather than stopping."""
    for process in processes:
        if process.poll() is None:
            if whole_group:
                os.killpg(process.pid, signal.SIGTERM)
            else:
                process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
