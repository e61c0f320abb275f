"""An order's lot moved to another, across the three apps in one transaction: booking moves the allocation
(`order_reassign_lot`, `order_move_lot`), payments credits the time a provider fault cost (a pro-rata refund) or
booking extends the window, and provisioning prepares the new lot and releases the hosts the order left
(provisioning/runs.py makes the runs). The console's "reassign", "Move (provider fault)" and "give up" on a failed
move call these services.
"""

from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from booking.locks import lock_order
from booking.models import Order
from booking.services import order_credit_time, order_move_lot, order_note, order_reassign_lot
from inventory.models import Host, Lot
from payments.refunds import refund_for_lost_time
from provisioning import enqueue, steps
from provisioning.models import Access, ProvisioningRun
from provisioning.rules import UNDER_WAY, ProvisioningError, acting
from provisioning.runs import access_release_left_hosts, held_host_ids, hosts_in_unfinished_runs, hosts_of, run_create


@transaction.atomic
def lot_reassign(*, order: Order, from_lot_id: int, to_lot_id: int, actor: AbstractBaseUser) -> ProvisioningRun | None:
    """The console's reassignment: booking moves the lot, then every host the order left is torn down (its
    account, keys and container), in the same transaction. Returns the release run, if a host was left. Where the
    order has an access on the old lot's host (a container may hold its cards), the old lot is only vacated, as a
    move's: it stays held for no one until the release run (or the next provisioning on that host, which makes the
    container again from the new lot) has seen the container go.

    A lot cannot move back to a host whose release is not finished: that teardown would undo the new
    provisioning there."""
    order = lock_order(order.pk)
    to_host_id = Lot.objects.filter(pk=to_lot_id).values_list("host_id", flat=True).first()
    if to_host_id in hosts_in_unfinished_runs(order, ProvisioningRun.Kind.RELEASE_HOST):
        host = Host.objects.get(pk=to_host_id)
        raise ProvisioningError(
            _(
                "Access on %(host)s is still being torn down for this order: choose a lot on another host, or move "
                "it back once that teardown has succeeded."
            )
            % {"host": host.name},
            field="to_lot",
        )
    from_host_id = Lot.objects.filter(pk=from_lot_id).values_list("host_id", flat=True).first()
    has_access = order.accesses.filter(host_id=from_host_id).exclude(status=Access.Status.REVOKED).exists()
    order_reassign_lot(order=order, from_lot_id=from_lot_id, to_lot_id=to_lot_id, actor=actor, vacate=has_access)
    return access_release_left_hosts(order=order, actor=actor, reason="lot reassigned")


class Credit:
    """How the time a provider fault cost is given back (the console's choice when it moves an order)."""

    NONE = "none"
    EXTENSION = "extension"  # the window ends later by the hours lost, if the lots are free for them
    REFUND = "refund"  # the hours lost refunded pro rata (payments.refunds.refund_for_lost_time), with a credit note
    ALL = (NONE, EXTENSION, REFUND)


@transaction.atomic
def order_move(
    *,
    order: Order,
    from_lot_id: int,
    to_lot_id: int,
    actor: AbstractBaseUser,
    hours_lost: int = 0,
    credit: str = Credit.NONE,
) -> ProvisioningRun:
    """A provider fault during a window: one of the order's lots moves to a free lot of its class for the rest of
    the window, the new lot is prepared, checked and handed over in one run (kind move), and only when it succeeds
    are the hosts the order left torn down (so the customer keeps working on the old one while it still works).
    On the same host the container is replaced and the data volume kept; on another host the customer starts from
    an empty volume, and is told so. The time lost is credited as a longer window or a pro-rata refund, in the
    same transaction: nothing moves if the credit cannot be given. The customer is e-mailed now and when the new
    machine is ready."""
    order = lock_order(order.pk)
    if credit not in Credit.ALL:
        raise ProvisioningError(_("Choose how the lost time is credited."), field="credit")
    window_hours = int((order.ends_at - order.starts_at).total_seconds() // 3600)
    if not isinstance(hours_lost, int) or not 0 <= hours_lost <= window_hours:
        raise ProvisioningError(
            _("The hours lost are a whole number from 0 to %(hours)d (the window's length).") % {"hours": window_hours},
            field="hours_lost",
        )
    if credit != Credit.NONE and hours_lost == 0:
        raise ProvisioningError(_("Say how many hours were lost, or credit nothing."), field="hours_lost")
    if order.provisioning_runs.filter(kind=ProvisioningRun.Kind.MOVE, status__in=UNDER_WAY).exists():
        raise ProvisioningError(_("A move of this order is under way: wait for it to finish (or fail) first."))
    # A failed move waiting for its retry is replaced by this one: it is never run again (saved, not updated: the
    # pages that show runs are drawn again on saves).
    replaced = list(
        order.provisioning_runs.filter(
            kind=ProvisioningRun.Kind.MOVE, status=ProvisioningRun.Status.FAILED, given_up_at__isnull=True
        )
    )
    for failed in replaced:
        failed.given_up_at, failed.next_retry_at = timezone.now(), None
        failed.save(update_fields=["given_up_at", "next_retry_at"])
    lots = dict(Lot.objects.filter(pk__in=[from_lot_id, to_lot_id]).values_list("pk", "host_id"))
    to_host_id = lots.get(to_lot_id)
    if to_host_id in hosts_in_unfinished_runs(order, ProvisioningRun.Kind.RELEASE_HOST, ProvisioningRun.Kind.TEARDOWN):
        raise ProvisioningError(
            _("Access on %(host)s is still being torn down for this order: choose a lot on another host.")
            % {"host": Host.objects.get(pk=to_host_id).name},
            field="to_lot",
        )
    data_kept = to_host_id in held_host_ids(order)  # before the move: the order already works on that host
    order_move_lot(order=order, from_lot_id=from_lot_id, to_lot_id=to_lot_id, actor=actor)
    if credit == Credit.EXTENSION:
        order_credit_time(order=order, lost=timedelta(hours=hours_lost), actor=actor)
    elif credit == Credit.REFUND:
        refund_for_lost_time(order=order, lost=timedelta(hours=hours_lost), lots=1)
    # The new lot's host first; then each host where the order keeps another lot beside one a move vacated (this
    # one, or an earlier move given up before it got there): its container is made again with the GPUs it keeps
    # (start_container replaces a container whose lot changed, the volume stays), which frees the vacated lots.
    held = hosts_of(order)
    vacated_on = set(
        order.allocations.filter(vacated_at__isnull=False, released_at__isnull=True).values_list(
            "lot__host_id", flat=True
        )
    )
    moved = [(host, indices) for host, indices in held if host.pk == to_host_id]
    moved += [(host, indices) for host, indices in held if host.pk != to_host_id and host.pk in vacated_on]
    run = run_create(order=order, kind=ProvisioningRun.Kind.MOVE, step_names=steps.MOVE_STEPS, actor=actor, hosts=moved)
    others = [(host, indices) for host, indices in held if host.pk not in {moved_host.pk for moved_host, _i in moved}]
    if credit == Credit.EXTENSION and others:  # the keys' expiry follows the window's new end there too
        run_create(order=order, kind=ProvisioningRun.Kind.KEYS, step_names=steps.KEYS_STEPS, actor=actor, hosts=others)
    host = moved[0][0]
    order_note(
        order=order,
        reason=f"moving to {host.name} after a provider fault",
        evidence={
            "run": run.pk,
            "data_kept": data_kept,
            "credit": credit,
            "hours_lost": hours_lost,
            **({"replaces_failed_moves": [failed.pk for failed in replaced]} if replaced else {}),
        },
        **acting(actor),
    )
    enqueue.send_order_moved(order.pk, run.pk, "started", data_kept, credit, hours_lost)
    return run


@transaction.atomic
def move_give_up(*, order: Order, run_id: int, actor: AbstractBaseUser, reason: str) -> ProvisioningRun:
    """An operator's decision on a failed move: it is not retried any more (the reason goes to the order's events).
    The customer keeps working where they are; the lot the move left stays held until its container is gone (the
    teardown at the window's end, or a later move that succeeds, removes it). The operator then moves the order
    again, ends it, or credits the customer."""
    reason = reason.strip()
    if not reason:
        raise ProvisioningError(_("Say why the move is given up: it is kept in the order's history."), field="reason")
    order = lock_order(order.pk)
    run = order.provisioning_runs.select_for_update().filter(pk=run_id, kind=ProvisioningRun.Kind.MOVE).first()
    if run is None or run.status != ProvisioningRun.Status.FAILED:
        raise ProvisioningError(_("Only a failed move can be given up: this one is not failed (any more)."))
    if run.given_up_at is not None:
        raise ProvisioningError(_("This move was given up already."))
    run.given_up_at, run.next_retry_at = timezone.now(), None
    run.save(update_fields=["given_up_at", "next_retry_at"])
    order_note(
        order=order,
        reason=f"move given up: {reason}",
        evidence={"run": run.pk, "attempts": run.attempts},
        **acting(actor),
    )
    return run
