"""The one event through which other apps react to an order's transitions.

`order_status_changed` is sent by `booking.services.order_transition` once the transition's transaction has
committed, never inside it: a reaction (auto-approval, teardown, refund flags, e-mails) that fails is logged and
cannot undo the transition that caused it. Receivers live in the app that owns the reaction and are connected in
its `apps.py`; booking itself knows none of them (dependencies run booking ← payments ← provisioning).

Arguments: `order_id`, `from_status`, `to_status`, `actor_kind` (an `OrderEvent.Actor`), `actor_id` (a user id
or None). Receivers load what they need fresh: the order may have moved on again by the time they run.
"""

import logging

from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger(__name__)

order_status_changed = Signal()


def send_order_status_changed_on_commit(
    *, order_id: int, from_status: str, to_status: str, actor_kind: str, actor_id: int | None
) -> None:
    def send() -> None:
        responses = order_status_changed.send_robust(
            sender="booking.Order",
            order_id=order_id,
            from_status=from_status,
            to_status=to_status,
            actor_kind=actor_kind,
            actor_id=actor_id,
        )
        for receiver, response in responses:
            if isinstance(response, Exception):
                logger.error(
                    "reaction %s to order %s %s -> %s failed",
                    getattr(receiver, "__qualname__", receiver),
                    order_id,
                    from_status,
                    to_status,
                    exc_info=response,
                )

    transaction.on_commit(send, robust=True)
