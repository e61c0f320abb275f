"""A task that logs an order's link and fails with it in its exception: loaded into a real worker (`--include`) by
the test that reads the worker's log for tokens. Never part of the portal."""

import logging

from celery import shared_task

logger = logging.getLogger("booking.tasks")


@shared_task(name="tests.leak_an_order_link")
def leak_an_order_link(link: str) -> None:
    logger.warning("sending the order's link %s", link)
    raise RuntimeError(f"could not reach {link}")
