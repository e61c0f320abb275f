"""Tasks looked up by name: each app's `enqueue` module queues its tasks through `task()` or `after_commit()`, so
that the services that queue work never import the tasks that call them (each app registers its tasks when ready,
in its apps.py)."""

import logging
from functools import partial

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)


def task(name: str):
    """The registered task called `name` (its @shared_task name)."""
    return current_app.tasks[name]


def after_commit(name: str, *args, **options) -> None:
    """Queue the task called `name` once the current transaction commits (at once outside one), with Celery's
    `apply_async` options (`countdown`). What the transaction did stands by then: a broker that does not answer must
    not raise into the request or task that committed it (a booking would answer 500, "nothing was booked", for an
    order that was placed and holds its lots). It is logged as an error instead, mailed to ADMINS in production,
    naming the task (never its arguments: addresses, keys); what a sweep looks for again (unprinted invoices, runs,
    holds) is taken up by it, an e-mail is not sent."""
    transaction.on_commit(partial(_publish, name, args, options))


def _publish(name: str, args: tuple, options: dict) -> None:
    try:
        task(name).apply_async(args=args, **options)
    except Exception as exc:  # kombu, redis-py and the SQLAlchemy transport raise many kinds: all mean "not queued"
        logger.error("task %s was not queued after its transaction committed: %s", name, type(exc).__name__)
