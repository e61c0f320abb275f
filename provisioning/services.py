"""Provisioning's entry points in the order's life: approval and rejection (by an operator, or by auto-approval),
the customer's key changes, and the reactions to the order's transitions that provisioning does not make itself
(`on_order_status_changed`, connected in provisioning/apps.py): auto-approval once paid, teardown once released.

Order transitions go through booking.services.order_transition (with the operator as actor). The runs they start
are provisioning/runs.py's, executed by provisioning/execution.py; the clock's part is provisioning/lifecycle.py.
"""

from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from booking import notices
from booking import services as booking_services
from booking.models import RELEASING_STATUSES, Order, OrderStatus
from booking.notices import Notice
from booking.rules import BookingError
from booking.services import order_transition
from booking.ssh_keys import SshPublicKey
from provisioning import enqueue, selectors
from provisioning.models import Access, OperatorSettings, ProvisioningRun
from provisioning.rules import ProvisioningError, acting
from provisioning.runs import access_keys_renew, download_keys_renew, provisioning_start, teardown_start

# --- approval ------------------------------------------------------------------------------------------------


@transaction.atomic
def order_approve(*, order: Order, actor: AbstractBaseUser | None, now: datetime | None = None) -> None:
    now = now or timezone.now()
    order_transition(order=order, to_status=OrderStatus.APPROVED, reason="approved", now=now, **acting(actor))
    if order.starts_at - timedelta(hours=OperatorSettings.current().provision_lead_hours) <= now:
        provisioning_start(order=order, actor=actor)


def order_reject(*, order: Order, actor: AbstractBaseUser, reason: str) -> None:
    """Refuse a paid order; its lots are released, and payments flags the refund owed (on the event)."""
    reason = reason.strip()
    if not reason:
        raise ProvisioningError(_("Give the reason for rejecting this order: the customer reads it."), field="reason")
    order_transition(
        order=order,
        to_status=OrderStatus.REJECTED,
        reason=f"rejected: {reason}",
        evidence={"reason": reason},
        **acting(actor),
    )


def order_rejected_email_send(*, order: Order) -> None:
    """Tell the customer that their paid order was refused, why (the operator's words) and that a refund is owed."""
    # The transition itself, not a later note at the same status (a refund opened, say).
    event = order.events.filter(to_status=OrderStatus.REJECTED).exclude(from_status=OrderStatus.REJECTED).last()
    if order.status != OrderStatus.REJECTED or event is None:
        return
    notices.send(Notice.ORDER_REJECTED, order=order, reason=str((event.evidence or {}).get("reason") or ""))


def access_keys_change(*, order: Order, add: list[SshPublicKey], remove_ids: list[int]) -> ProvisioningRun | None:
    """The customer changes their keys: booking records them, a running window gets them rewritten on its machines
    at once (a keys run; before the hand-over, the hand-over writes them; after the end, the download window's), a
    key removed ends every session open there, and the contact is told by e-mail either way, so that a leaked order
    link cannot add a key unseen. Returns the keys run, if one was started."""
    with transaction.atomic():
        if order.status == OrderStatus.ENDED and not selectors.keys_can_change(order):
            raise BookingError(_("The files of this order were deleted: no machine takes its keys any more."))
        added, removed = booking_services.order_keys_change(order=order, add=add, remove_ids=remove_ids)
        if not added and not removed:
            return None
        order.refresh_from_db(fields=["status"])
        # A key removed ends what it opened: every session open on the order's machines (container_steps.end_sessions)
        if order.status in (OrderStatus.READY, OrderStatus.ACTIVE):
            run = access_keys_renew(order=order, end_sessions=bool(removed))
        elif order.status == OrderStatus.ENDED:  # the files are kept: the download window takes the keys of the day
            run = download_keys_renew(order=order, end_sessions=bool(removed))
        else:
            run = None
        enqueue.send_keys_changed(order.pk, added, removed, run is not None)
    return run


def keys_changed_email_send(*, order: Order, added: list, removed: list, applied: bool) -> None:
    if not all(isinstance(value, str) for value in [*added, *removed]):  # task arguments are input too
        return
    notices.send(Notice.KEYS_CHANGED, order=order, added=added, removed=removed, applied=bool(applied))


# --- reactions to the order's transitions ---------------------------------------------------------------------


def on_order_status_changed(*, order_id: int, to_status: str, **kwargs) -> None:
    """Receiver of booking's `order_status_changed`, after the transition's commit (provisioning/apps.py)."""
    if to_status == OrderStatus.PAID:
        order_auto_approve(order_id=order_id)
    if to_status == OrderStatus.REJECTED:
        enqueue.send_order_rejected_now(order_id)
    elif to_status in RELEASING_STATUSES:
        access_release(order_id=order_id, reason=f"order {to_status}")


def order_auto_approve(*, order_id: int) -> bool:
    """Approve a paid order at once when the operators chose auto-approval. Beat's lifecycle tick calls it too,
    for an order whose event was lost (a worker stopped between the commit and the reaction)."""
    if not OperatorSettings.current().auto_approve:
        return False
    with transaction.atomic():
        order = Order.objects.select_for_update().filter(pk=order_id, status=OrderStatus.PAID).first()
        if order is None:  # approved, rejected or cancelled meanwhile
            return False
        order_approve(order=order, actor=None)
    return True


def access_release(*, order_id: int, reason: str) -> ProvisioningRun | None:
    """An order that ended, or was cancelled, rejected or expired, keeps no access: tear down every access that
    was prepared, or is being prepared. Nothing to do when none was, or when a teardown is under way."""
    order = Order.objects.get(pk=order_id)
    if not order.accesses.exclude(status=Access.Status.REVOKED).exists():
        return None
    try:
        return teardown_start(order=order, reason=reason)
    except ProvisioningError:  # already under way
        return None
