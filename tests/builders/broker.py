"""The broker stopped, as a unit test meets it: tasks published (not run in-process) to a Redis that does not answer."""

from collections.abc import Iterator
from contextlib import contextmanager

from portal.celery import app as celery_app


def _drop_connection_pool() -> None:
    # As Celery itself does after a fork: the next publish builds a pool for the current broker URL.
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


@contextmanager
def broker_down() -> Iterator[None]:
    """Within: every publish goes to a stopped Redis (nothing listens on port 1). After: the real broker, eager."""
    original = celery_app.conf.broker_url
    celery_app.conf.task_always_eager = False
    celery_app.conf.broker_url = "redis://127.0.0.1:1/0"
    _drop_connection_pool()  # connections opened earlier in this process would still reach the real one
    try:
        yield
    finally:
        celery_app.conf.broker_url = original
        celery_app.conf.task_always_eager = True
        _drop_connection_pool()
