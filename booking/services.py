"""Every write of the booking app. One transaction each; follow-up work is enqueued on commit."""

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from booking import availability, notices, selectors
from booking.locks import lock_capacity, lock_order, lock_order_and_capacity
from booking.models import (
    ORDER_TRANSITIONS,
    RELEASING_STATUSES,
    Allocation,
    BookingPolicy,
    EnvironmentImage,
    Hypothesis,
    Order,
    OrderAccessToken,
    OrderEvent,
    OrderSshKey,
    OrderStatus,
    WindowDays,
)
from booking.notices import Notice
from booking.rules import (
    BookingError,
    InvalidTransition,
    SoldOut,
    capacity_problem,
    check_environment,
    check_window,
)
from booking.signals import send_order_status_changed_on_commit
from booking.ssh_keys import SshPublicKey
from booking.tokens import new_access_token, new_public_id, token_hash
from inventory.models import HardwareClass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Contact:
    name: str
    email: str
    organisation: str
    messenger: str = ""


@dataclass(frozen=True)
class BookingRequest:
    hardware_class: HardwareClass
    environment: EnvironmentImage
    lot_count: int
    start_date: date
    days: int
    contact: Contact
    ssh_keys: list[SshPublicKey]
    hypothesis: str
    hypothesis_detail: str = ""
    notes: str = ""
    language: str = "en"
    fit_inputs: dict | None = None
    fit_advice: dict | None = None
    client_key: str = ""  # portal.client.client_key of the request: counts unpaid lots per client address


def _check_request(*, request: BookingRequest, policy: BookingPolicy, now: datetime) -> None:
    """Python checks for friendly messages; the database constraints remain the guarantee."""
    check_environment(hardware_class=request.hardware_class, environment=request.environment)
    check_window(start_date=request.start_date, days=request.days, lot_count=request.lot_count, policy=policy, now=now)
    if request.hypothesis not in Hypothesis.values:
        raise BookingError(_("Choose a hypothesis."), field="hypothesis")
    if request.hypothesis == Hypothesis.OTHER and not request.hypothesis_detail.strip():
        raise BookingError(_("Describe your hypothesis in a few words."), field="hypothesis_detail")
    if not request.ssh_keys:
        raise BookingError(_("Give at least one SSH public key."), field="ssh_keys")


def _elsewhen(*, request: BookingRequest, policy: BookingPolicy, now: datetime) -> tuple[int, list[date]]:
    """The class's active lots, and the next start dates with enough of them free."""
    total = selectors.active_lot_count(hardware_class=request.hardware_class)
    next_dates = []
    if total >= request.lot_count:
        next_dates = selectors.next_start_dates(
            hardware_class=request.hardware_class,
            lot_count=request.lot_count,
            days=request.days,
            after=request.start_date + timedelta(days=1),
            policy=policy,
            now=now,
        )
    return total, next_dates


def _sold_out_answer(*, request: BookingRequest, free: int, total: int, next_dates: list[date]) -> BookingError:
    message = capacity_problem(
        hardware_class=request.hardware_class, lot_count=request.lot_count, free=min(free, total), total=total
    )
    if total < request.lot_count:  # more lots than exist: a wrong number, not a full calendar
        return BookingError(message, field="lots")
    return SoldOut(message or "", next_dates=next_dates)


def _availability_hint(
    *, request: BookingRequest, policy: BookingPolicy, window: selectors.Window, now: datetime
) -> tuple[int, int, list[date]]:
    """(free lots, active lots, next dates when short) for this request, read without any lock and kept in the
    shared cache until the next booking, release or catalog edit (the booking page's generation): a rush on the
    last lot is answered "sold out" without a query. Only a hint: a booking that looks possible is decided under
    the class lock, and releases bump the generation on commit, so a stale hint never refuses a free lot."""

    def compute() -> tuple[int, int, list[date]]:
        free = len(
            selectors.free_lot_ids(hardware_class=request.hardware_class, window=window, limit=request.lot_count)
        )
        if free >= request.lot_count:
            return free, free, []
        return free, *_elsewhen(request=request, policy=policy, now=now)

    key = f"booking:availability:{request.hardware_class.pk}:{request.start_date}:{request.days}:{request.lot_count}"
    return availability.remember(key, compute)


def _price_per_lot(*, hardware_class: HardwareClass, days: int) -> Decimal | None:
    # From the prices the catalog prefetched when it did; one query otherwise.
    return next((price.amount_per_lot for price in hardware_class.prices.all() if price.days == days), None)


@dataclass(frozen=True)
class OrderPlan:
    """A booking request that passed every check made without a lock: what `order_hold` needs."""

    request: BookingRequest
    policy: BookingPolicy
    window: selectors.Window
    price_per_lot: Decimal
    now: datetime


class SoldOutUnderLock(Exception):
    """The lots looked free, but were gone once the class was locked. `sold_out_answer` says what to tell the
    researcher, outside the transaction (it looks up the next dates)."""

    def __init__(self, free: int):
        self.free = free


def order_plan(
    *, request: BookingRequest, now: datetime | None = None, policy: BookingPolicy | None = None
) -> OrderPlan:
    """The checks before placing an order, made without any lock: the request's own rules, the price, and the
    cached availability hint. A rush on the last lot is answered here, sold out, without waiting for the lock
    (raises BookingError or SoldOut)."""
    now = now or timezone.now()
    policy = policy or BookingPolicy.current()
    _check_request(request=request, policy=policy, now=now)
    price_per_lot = _price_per_lot(hardware_class=request.hardware_class, days=request.days)
    if price_per_lot is None:
        raise BookingError(_("This window is not on sale for this hardware class."), field="days")
    window = selectors.window_for(start_date=request.start_date, days=request.days, policy=policy)
    free, total, next_dates = _availability_hint(request=request, policy=policy, window=window, now=now)
    if free < request.lot_count:
        raise _sold_out_answer(request=request, free=free, total=total, next_dates=next_dates)
    return OrderPlan(request=request, policy=policy, window=window, price_per_lot=price_per_lot, now=now)


def sold_out_answer(*, plan: OrderPlan, refused: SoldOutUnderLock) -> BookingError:
    """What to tell a researcher whose lots were taken under the lock (call outside the transaction)."""
    total, next_dates = _elsewhen(request=plan.request, policy=plan.policy, now=plan.now)
    return _sold_out_answer(request=plan.request, free=refused.free, total=total, next_dates=next_dates)


def order_hold(*, plan: OrderPlan) -> tuple[Order, str]:
    """Hold specific lots for the planned window and write the order, inside the caller's transaction (the
    orchestrator adds the invoice to it). Bookings of one class are serialised by the class lock; the exclusion
    constraint on allocations (PostgreSQL) is the guarantee behind it. Raises SoldOutUnderLock when the lots
    are gone. Returns the order and its secret token (shown once)."""
    request = plan.request
    lock_capacity(request.hardware_class.pk)
    _check_unpaid_lots(request=request, policy=plan.policy, now=plan.now)
    lot_ids = selectors.free_lot_ids(hardware_class=request.hardware_class, window=plan.window, limit=request.lot_count)
    if len(lot_ids) < request.lot_count:
        raise SoldOutUnderLock(free=len(lot_ids))
    order = _order_from(plan)
    try:
        with transaction.atomic():
            Allocation.objects.bulk_create(
                Allocation(order=order, lot_id=lot_id, starts_at=plan.window.held_from, ends_at=plan.window.held_until)
                for lot_id in lot_ids
            )
    except IntegrityError as exc:  # the exclusion constraint caught an overlap the lock did not prevent
        logger.warning("allocation overlap refused for %s: %s", order.public_id, exc)
        raise SoldOutUnderLock(free=0) from exc
    OrderSshKey.objects.bulk_create(
        OrderSshKey(
            order=order, key_type=key.key_type, bits=key.bits, fingerprint=key.fingerprint, public_key=key.openssh()
        )
        for key in request.ssh_keys
    )
    token = _issue_token(order=order)
    OrderEvent.objects.create(
        order=order,
        from_status="",
        to_status=OrderStatus.AWAITING_PAYMENT,
        actor_kind=OrderEvent.Actor.CUSTOMER,
        reason="order placed",
        evidence={"lots": len(lot_ids), "held_until": order.hold_expires_at.isoformat()},
    )
    from booking.tasks import send_order_link

    send_order_link.delay_on_commit(order.pk)
    return order, token


def _check_unpaid_lots(*, request: BookingRequest, policy: BookingPolicy, now: datetime) -> None:
    """Holding lots costs nothing until paid: one e-mail address or one client address holds at most the policy's
    number of unpaid lots at a time. Checked under the class lock (two bookings of different classes at the same
    instant may both pass; the hold then ends with the quote anyway)."""
    held = selectors.unpaid_lots_of(email=request.contact.email, client_key=request.client_key)
    limit = policy.max_unpaid_lots_per_client
    if held.lots + request.lot_count <= limit:
        return
    frees_at = (held.first_release or now).astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    message = ngettext(
        "Your e-mail address or your connection already holds %(held)s unpaid lot, and one client may hold at most "
        "%(limit)s at a time: held lots are kept from other researchers until they are paid. Pay or cancel an "
        "unpaid order, or wait until its hold ends (%(frees_at)s UTC), then book again.",
        "Your e-mail address or your connection already holds %(held)s unpaid lots, and one client may hold at "
        "most %(limit)s at a time: held lots are kept from other researchers until they are paid. Pay or cancel "
        "an unpaid order, or wait until its hold ends (%(frees_at)s UTC), then book again.",
        held.lots,
    )
    raise BookingError(
        message % {"held": held.lots, "limit": limit, "frees_at": frees_at},
        field="lots",
    )


def _order_from(plan: OrderPlan) -> Order:
    request = plan.request
    return Order.objects.create(
        public_id=new_public_id(),
        status=OrderStatus.AWAITING_PAYMENT,
        hardware_class=request.hardware_class,
        environment=request.environment,
        lot_count=request.lot_count,
        days=request.days,
        starts_at=plan.window.starts_at,
        ends_at=plan.window.ends_at,
        contact_name=request.contact.name,
        contact_email=request.contact.email,
        organisation=request.contact.organisation,
        messenger=request.contact.messenger,
        hypothesis=request.hypothesis,
        hypothesis_detail=request.hypothesis_detail,
        notes=request.notes,
        currency=settings.PRICE_CURRENCY,
        price_per_lot=plan.price_per_lot,
        total_price=plan.price_per_lot * request.lot_count,
        hold_expires_at=plan.now + timedelta(minutes=plan.policy.hold_minutes),
        language=request.language,
        client_key=request.client_key,
        fit_inputs=request.fit_inputs,
        fit_advice=request.fit_advice,
    )


def _issue_token(*, order: Order) -> str:
    token = new_access_token()
    OrderAccessToken.objects.create(order=order, token_hash=token_hash(token))
    return token


def order_link(*, order: Order, token: str) -> str:
    return settings.SITE_URL + reverse("booking:order", kwargs={"public_id": order.public_id, "token": token})


def order_note(
    *,
    order: Order,
    reason: str,
    actor_kind: str,
    actor: AbstractBaseUser | None = None,
    evidence: dict | None = None,
) -> OrderEvent:
    """Record something notable that is not a transition (a lot moved, an extension asked for, a link revoked)
    in the order's audit trail, at its current status."""
    return OrderEvent.objects.create(
        order=order,
        from_status=order.status,
        to_status=order.status,
        actor_kind=actor_kind,
        actor=actor,
        reason=reason,
        evidence=evidence or {},
    )


@transaction.atomic
def order_transition(
    *,
    order: Order,
    to_status: str,
    actor_kind: str,
    actor: AbstractBaseUser | None = None,
    reason: str = "",
    evidence: dict | None = None,
    now: datetime | None = None,
) -> bool:
    """Move the order to `to_status` if the state machine allows it; False when it is already there.

    Locks the order row, records an OrderEvent, releases the lots when the new state ends the order, and sends
    `order_status_changed` once the transaction commits (booking/signals.py): what other apps do about it runs
    then, and cannot undo the transition.
    """
    locked = lock_order(order.pk)
    if locked.status == to_status:
        order.status = locked.status
        return False
    if to_status not in ORDER_TRANSITIONS[locked.status]:
        raise InvalidTransition(
            _("An order that is “%(current)s” cannot become “%(target)s”.")
            % {"current": locked.get_status_display(), "target": OrderStatus(to_status).label}
        )
    now = now or timezone.now()
    from_status = locked.status
    update_fields = ["status", "updated_at"]
    if to_status in RELEASING_STATUSES:
        # Bumps availability first among the on-commit callbacks (AllocationQuerySet): the booking page shows the
        # lots free before any order page says they were released.
        Allocation.objects.filter(order=locked, released_at__isnull=True).update(released_at=now)
        locked.hold_expires_at = None
        update_fields.append("hold_expires_at")
    OrderEvent.objects.create(
        order=locked,
        from_status=from_status,
        to_status=to_status,
        actor_kind=actor_kind,
        actor=actor,
        reason=reason,
        evidence=evidence or {},
    )
    locked.status = to_status
    locked.save(update_fields=update_fields)
    order.status = locked.status
    order.hold_expires_at = locked.hold_expires_at
    send_order_status_changed_on_commit(
        order_id=locked.pk,
        from_status=from_status,
        to_status=to_status,
        actor_kind=actor_kind,
        actor_id=actor.pk if actor is not None else None,
    )
    return True


@transaction.atomic
def order_reallocate_after_late_payment(
    *, order: Order, evidence: dict, now: datetime | None = None, actor: AbstractBaseUser | None = None
) -> None:
    """A payment confirmed after the hold expired: hold lots again for the same window if enough are free, and
    mark the order paid; otherwise raise SoldOut (the payments app flags the invoice for an operator)."""
    now = now or timezone.now()
    policy = BookingPolicy.current()
    order = lock_order_and_capacity(order.pk)
    window = selectors.window_for(start_date=order.starts_at.date(), days=order.days, policy=policy)
    lot_ids = selectors.free_lot_ids(hardware_class=order.hardware_class, window=window, limit=order.lot_count)
    if len(lot_ids) < order.lot_count or order.starts_at <= now:
        raise SoldOut(_("The lots of this order were taken after it expired."), next_dates=[])
    Allocation.objects.bulk_create(
        Allocation(order=order, lot_id=lot_id, starts_at=window.held_from, ends_at=window.held_until)
        for lot_id in lot_ids
    )
    order_transition(
        order=order,
        to_status=OrderStatus.PAID,
        actor_kind=OrderEvent.Actor.ADMIN if actor else OrderEvent.Actor.SYSTEM,
        actor=actor,
        reason="late payment: lots allocated again",
        evidence=evidence,
        now=now,
    )


# Before access exists on a host, its lots can move; later, tear down first.
REASSIGNABLE = frozenset({OrderStatus.PAID, OrderStatus.APPROVED, OrderStatus.PROVISIONING_FAILED})


@transaction.atomic
def order_reassign_lot(
    *, order: Order, from_lot_id: int, to_lot_id: int, actor: AbstractBaseUser, now: datetime | None = None
) -> None:
    """Move one of the order's lots to another free lot of the same class, for the same period. The new
    allocation is checked by the same exclusion constraint as a booking."""
    now = now or timezone.now()
    order = lock_order(order.pk)
    if order.status not in REASSIGNABLE:
        raise BookingError(_("Lots can be moved before access is prepared, or after a failed provisioning."))
    lock_capacity(order.hardware_class_id)
    current = Allocation.objects.select_for_update().filter(order=order, lot_id=from_lot_id, released_at__isnull=True)
    allocation = current.first()
    if allocation is None:
        raise BookingError(_("This lot is not allocated to the order."), field="from_lot")
    policy = BookingPolicy.current()
    window = selectors.window_for(start_date=order.starts_at.date(), days=order.days, policy=policy)
    free = selectors.free_lot_ids(hardware_class=order.hardware_class, window=window, limit=10_000)
    if to_lot_id not in free:
        raise BookingError(_("That lot is not free for this window, or not of this class."), field="to_lot")
    current.update(released_at=now)
    try:
        with transaction.atomic():
            Allocation.objects.create(
                order=order, lot_id=to_lot_id, starts_at=allocation.starts_at, ends_at=allocation.ends_at
            )
    except IntegrityError as exc:
        raise BookingError(_("That lot was taken meanwhile."), field="to_lot") from exc
    order_note(
        order=order,
        reason="lot reassigned",
        actor_kind=OrderEvent.Actor.OPERATOR,
        actor=actor,
        evidence={"from_lot": from_lot_id, "to_lot": to_lot_id},
    )


def extension_check(*, order: Order, days: int) -> selectors.Window:
    """The extension window right after the order's end if the same lots are free for it, else BookingError."""
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE):
        raise BookingError(_("Only a ready or active window can be extended."))
    if days not in WindowDays.values:
        raise BookingError(_("Choose an extension of 3, 7 or 30 days."), field="days")
    policy = BookingPolicy.current()
    held_from, held_until = order.ends_at + policy.turnaround, order.ends_at + timedelta(days=days) + policy.turnaround
    lot_ids = list(order.allocations.filter(released_at__isnull=True).values_list("lot_id", flat=True))
    taken = Allocation.objects.filter(
        lot_id__in=lot_ids, released_at__isnull=True, starts_at__lt=held_until, ends_at__gt=held_from
    ).exclude(order=order)
    if taken.exists():
        raise BookingError(_("The same lots are booked after this window: it cannot be extended."))
    return selectors.Window(
        starts_at=order.ends_at,
        ends_at=order.ends_at + timedelta(days=days),
        held_from=held_from,
        held_until=held_until,
    )


def extension_price(*, order: Order, days: int) -> Decimal:
    """What extending the order by `days` costs, if the extension is possible now (else BookingError)."""
    extension_check(order=order, days=days)
    price = order.hardware_class.prices.filter(days=days).values_list("amount_per_lot", flat=True).first()
    if price is None:
        raise BookingError(_("This window is not on sale for this hardware class."), field="days")
    return price * order.lot_count


@transaction.atomic
def order_extend(*, order: Order, days: int, evidence: dict) -> None:
    """The extension is paid: move the end and the lots' periods. The exclusion constraint re-checks them; the
    end warnings are kept per window end, so they run again before the new one."""
    order = lock_order(order.pk)
    window = extension_check(order=order, days=days)
    Allocation.objects.filter(order=order, released_at__isnull=True).update(ends_at=window.held_until)
    order.ends_at = window.ends_at
    order.save(update_fields=["ends_at", "updated_at"])
    order_note(
        order=order,
        reason=f"window extended by {days} days",
        actor_kind=OrderEvent.Actor.SYSTEM,
        evidence={**evidence, "new_end": window.ends_at.isoformat()},
    )


def order_cancel_by_customer(*, order: Order) -> None:
    if not order.can_be_cancelled_by_customer:
        raise InvalidTransition(_("This order can no longer be cancelled here: write to us instead."))
    order_transition(
        order=order,
        to_status=OrderStatus.CANCELLED,
        actor_kind=OrderEvent.Actor.CUSTOMER,
        reason="cancelled by customer",
    )


def order_cancel_by_operator(*, order: Order, actor: AbstractBaseUser, reason: str = "") -> bool:
    """Cancel the order and release its lots. What follows (a refund flag on a paid invoice, the teardown of
    access already prepared) happens in the apps that own it, on the order_status_changed event."""
    return order_transition(
        order=order,
        to_status=OrderStatus.CANCELLED,
        actor_kind=OrderEvent.Actor.OPERATOR,
        actor=actor,
        reason=f"cancelled by an operator: {reason}".strip(": "),
    )


@transaction.atomic
def order_hold_extend(*, order: Order, until: datetime, reason: str, evidence: dict | None = None) -> bool:
    """Keep an unpaid order's lots held until `until` (never shortens a hold). Payments calls it when the chain it
    is paid on could not be checked: a hold must not run out while nobody can see the payment."""
    order = lock_order(order.pk)
    if order.status != OrderStatus.AWAITING_PAYMENT or order.hold_expires_at is None or order.hold_expires_at >= until:
        return False
    held_until = order.hold_expires_at
    order.hold_expires_at = until
    order.save(update_fields=["hold_expires_at", "updated_at"])
    order_note(
        order=order,
        reason=reason,
        actor_kind=OrderEvent.Actor.SYSTEM,
        evidence={**(evidence or {}), "held_until": held_until.isoformat(), "now_held_until": until.isoformat()},
    )
    return True


def orders_expire_stale_holds(*, now: datetime | None = None, batch_size: int = 200) -> int:
    """Expire orders whose hold ran out unpaid; releases their lots. Safe to run twice at once."""
    now = now or timezone.now()
    expired = 0
    candidate_ids = list(
        Order.objects.filter(status=OrderStatus.AWAITING_PAYMENT, hold_expires_at__lt=now)
        .order_by("hold_expires_at")
        .values_list("pk", flat=True)[:batch_size]
    )
    for order_id in candidate_ids:
        with transaction.atomic():
            order = (
                Order.objects.select_for_update(skip_locked=True)
                .filter(pk=order_id, status=OrderStatus.AWAITING_PAYMENT, hold_expires_at__lt=now)
                .first()
            )
            if order is None:  # paid, cancelled or being handled by another sweep meanwhile
                continue
            expired += order_transition(
                order=order,
                to_status=OrderStatus.EXPIRED,
                actor_kind=OrderEvent.Actor.SYSTEM,
                reason="hold expired before payment",
                now=now,
            )
    return expired


def order_send_link(*, order: Order) -> None:
    """E-mail a fresh secret link to the order's contact (a new token, so no secret travels through the broker)."""
    token = _issue_token(order=order)
    notices.send(Notice.ORDER_LINK, order=order, link=order_link(order=order, token=token))


@transaction.atomic
def order_links_revoke(*, order: Order) -> int:
    """Every secret link of the order stops working at once (the one used included); a new one is mailed to the
    order's contact, minted by the task so that no secret travels through the broker. Returns how many links
    were revoked."""
    order = lock_order(order.pk)
    revoked, _by_model = order.access_tokens.all().delete()  # post_delete: the status polls of old links stop
    order_note(order=order, reason="links revoked", actor_kind=OrderEvent.Actor.CUSTOMER, evidence={"links": revoked})
    from booking.tasks import send_order_link

    send_order_link.delay_on_commit(order.pk)
    return revoked


def orders_send_links(*, email: str, language: str, now: datetime | None = None) -> int:
    """E-mail fresh links to every recent order of an address. Sends nothing when there is none."""
    now = now or timezone.now()
    orders = list(selectors.orders_for_email(email=email, since=now - timedelta(days=400))[:20])
    if not orders:
        return 0
    links = [(order, order_link(order=order, token=_issue_token(order=order))) for order in orders]
    notices.send(Notice.ORDER_LINKS, to=orders[0].contact_email, language=language, links=links)
    return len(orders)


def orders_request_links(*, email: str, language: str) -> None:
    """Ask for fresh links by e-mail. Same work whether or not the address has orders (nothing to learn)."""
    from booking.tasks import send_order_links

    send_order_links.delay_on_commit(email.strip().lower(), language)


def split_trial_upload(*, order: Order, raw: bytes):
    """Keep a split-trial kit report with the order, once it has been validated field by field."""
    from booking.models import SplitTrialReport
    from booking.split_trial_report import InvalidReport, parse_report

    try:
        report = parse_report(raw)
    except InvalidReport as exc:
        raise BookingError(
            SPLIT_TRIAL_MESSAGES.get(exc.code, SPLIT_TRIAL_MESSAGES["not_json"]), field="report"
        ) from exc
    if order.split_trials.count() >= 20:
        raise BookingError(_("This order already keeps 20 reports."), field="report")
    return SplitTrialReport.objects.create(order=order, report=report)


def _split_trial_messages() -> dict:

    return {
        "too_large": gettext_lazy("This report is too large: a split-trial report is a few kilobytes of JSON."),
        "not_json": gettext_lazy("This file is not a JSON report written by the split-trial kit."),
        "too_deep": gettext_lazy("This JSON is nested too deeply to be a split-trial report."),
        "wrong_schema": gettext_lazy("This is not a split-trial report (schema binome.split-trial/1)."),
        "missing_field": gettext_lazy("This report misses a field the split-trial kit always writes."),
        "bad_field": gettext_lazy("A field of this report has the wrong type."),
        "bad_number": gettext_lazy("A number of this report is not a finite, plausible measurement."),
        "bad_text": gettext_lazy("A text of this report is empty or too long."),
        "bad_ranks": gettext_lazy("The two-card phase must report exactly ranks 0 and 1, consistent with the run."),
    }


SPLIT_TRIAL_MESSAGES = _split_trial_messages()
