"""Placing an order: the request, the plan made without a lock (checks, price, the sold-out answer), and the hold
of specific lots under the class lock, written in the caller's transaction (payments/checkout.py adds the invoice).
"""

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from booking import availability, enqueue, selectors
from booking.billing import BillingDetails, billing_check
from booking.links import issue_token
from booking.locks import lock_capacity, lock_client, lock_order
from booking.models import (
    Allocation,
    BookingPolicy,
    EnvironmentImage,
    Order,
    OrderEvent,
    OrderSshKey,
    OrderStatus,
    Sharing,
    WindowDays,
)
from booking.rules import (
    BookingError,
    ConfirmAddressFirst,
    SoldOut,
    StaleTerms,
    capacity_problem,
    check_environment,
    check_research,
    check_window,
    clean_checkpoint_dir,
)
from booking.ssh_keys import SshPublicKey
from booking.terms import terms_current
from booking.tokens import new_public_id
from inventory.models import HardwareClass

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Contact:
    name: str
    email: str
    organisation: str
    messenger: str = ""


@dataclass(frozen=True)
class Research:
    """What the researcher writes down before renting (the offer page's method): what the two cards share, the
    hypothesis in their words with the measure that would confirm it, and a 30-day campaign's plan."""

    hypothesis: str
    detail: str
    measure: str
    sharing: str = Sharing.NOT_SURE
    checkpoint_interval_hours: int | None = None
    stop_criteria: str = ""
    checkpoint_dir: str = ""  # where the checkpoints are written, in the home (booking.rules.clean_checkpoint_dir)


@dataclass(frozen=True)
class DataCarry:
    """The customer's earlier order whose data volume the new order takes over, and the host that keeps it: the new
    order's lots are all taken on that host. The caller proved the customer holds `order` (its secret link) and
    found where its data is kept."""

    order: Order
    host_id: int
    # When the earlier order's files are deleted (provisioning's wipe date): the new window must start before it,
    # or the wipe would wait for it and the volume hold the host's disk as long as the customer chooses.
    kept_until: datetime


@dataclass(frozen=True)
class BookingRequest:
    hardware_class: HardwareClass
    environment: EnvironmentImage
    lot_count: int
    start_date: date  # not read when the window starts as soon as ready
    days: int
    contact: Contact
    ssh_keys: list[SshPublicKey]
    research: Research
    notes: str = ""
    language: str = "en"
    fit_inputs: dict | None = None
    fit_advice: dict | None = None
    client_key: str = ""  # infrastructure.client.client_key of the request: counts unpaid lots per client address
    terms_version_id: int | None = None  # the terms version the customer accepted (the form's hidden field)
    # Who the fiscal invoice is made out to (the booking form always gives them; scripts placing orders may not).
    billing: BillingDetails | None = None
    carry: DataCarry | None = None
    # The contact proved the mailbox of `contact.email` in the browser that books (opened a link e-mailed there):
    # the order is confirmed from the start, and the class's share of unconfirmed holds does not apply.
    contact_confirmed: bool = False
    # Start today, at the first full hour the class's hosts can make, its days counting from the hand-over.
    start_when_ready: bool = False
    # The researcher's archcheck report, validated (booking/archcheck_report.py), kept with the order.
    archcheck_report: dict | None = None


def _check_request(*, request: BookingRequest, policy: BookingPolicy, now: datetime) -> None:
    """Python checks for friendly messages; the database constraints remain the guarantee."""
    check_environment(hardware_class=request.hardware_class, environment=request.environment)
    check_window(
        start_date=request.start_date,
        days=request.days,
        lot_count=request.lot_count,
        policy=policy,
        now=now,
        when_ready=request.start_when_ready,
    )
    research = request.research
    check_research(
        sharing=research.sharing,
        hypothesis=research.hypothesis,
        detail=research.detail,
        measure=research.measure,
        days=request.days,
        checkpoint_interval_hours=research.checkpoint_interval_hours,
        stop_criteria=research.stop_criteria,
    )
    clean_checkpoint_dir(research.checkpoint_dir)
    if not request.ssh_keys:
        raise BookingError(_("Give at least one SSH public key."), field="ssh_keys")
    if request.billing is not None:
        billing_check(request.billing)
    _check_terms(terms_version_id=request.terms_version_id)


def _check_terms(*, terms_version_id: int | None) -> None:
    """The customer accepted the current terms version, not one replaced since they opened the page."""
    current = terms_current()
    if current is None:
        raise BookingError(_("Booking is closed until the operator publishes the terms of sale."))
    if terms_version_id is None:
        raise BookingError(_("Read and accept the terms of sale to book."), field="accept_terms")
    if terms_version_id != current.pk:
        raise StaleTerms(
            _(
                "The terms of sale changed after you opened this page: version %(number)s of %(date)s is now "
                "current. Please read it, then accept it again to book. Everything else you entered is kept."
            )
            % {"number": current.number, "date": current.published_at.strftime("%Y-%m-%d")}
        )


def _elsewhen(*, request: BookingRequest, policy: BookingPolicy, now: datetime) -> tuple[int, list[date]]:
    """The class's active lots, and the next start dates with enough of them free (after the chosen date; from the
    first bookable one for a window that was to start as soon as ready)."""
    total = selectors.active_lot_count(hardware_class=request.hardware_class)
    next_dates = []
    if total >= request.lot_count:
        next_dates = selectors.next_start_dates(
            hardware_class=request.hardware_class,
            lot_count=request.lot_count,
            days=request.days,
            after=now.date() if request.start_when_ready else request.start_date + timedelta(days=1),
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

    def compute_json() -> list:  # the shared cache holds JSON: dates as ISO text
        free, total, next_dates = compute()
        return [free, total, [day.isoformat() for day in next_dates]]

    key = f"booking:availability:{request.hardware_class.pk}:{request.start_date}:{request.days}:{request.lot_count}"
    free, total, next_dates = availability.remember(key, compute_json)
    return free, total, [date.fromisoformat(day) for day in next_dates]


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
    # A window that starts as soon as ready takes lots only on hosts ready within this (selectors.ready_start).
    ready_within: timedelta | None = None


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
    if request.start_when_ready:
        return _ready_plan(request=request, policy=policy, price_per_lot=price_per_lot, now=now)
    window = selectors.window_for(start_date=request.start_date, days=request.days, policy=policy)
    if request.carry is not None:
        _check_carry(request=request, window=window)
    free, total, next_dates = _availability_hint(request=request, policy=policy, window=window, now=now)
    if free < request.lot_count:
        raise _sold_out_answer(request=request, free=free, total=total, next_dates=next_dates)
    return OrderPlan(request=request, policy=policy, window=window, price_per_lot=price_per_lot, now=now)


def _ready_plan(*, request: BookingRequest, policy: BookingPolicy, price_per_lot: Decimal, now: datetime) -> OrderPlan:
    """A window that starts as soon as ready: the first full hour the class's hosts can make with enough free lots
    (read here, not from the cached hint: the start moves with the clock). None free so soon: sold out, with the
    next dates."""
    ready = selectors.ready_start(
        hardware_class=request.hardware_class, days=request.days, lot_count=request.lot_count, policy=policy, now=now
    )
    if ready is None:
        total, next_dates = _elsewhen(request=request, policy=policy, now=now)
        raise _sold_out_answer(request=request, free=0, total=total, next_dates=next_dates)
    if request.carry is not None:
        _check_carry(request=request, window=ready.window)
    return OrderPlan(
        request=request,
        policy=policy,
        window=ready.window,
        price_per_lot=price_per_lot,
        now=now,
        ready_within=ready.ready_within,
    )


def _check_carry(*, request: BookingRequest, window: selectors.Window) -> None:
    """The data can be carried: no other live order carries it, and enough lots of the class are free on its host
    for the window (else the customer is told, and may book without carrying it)."""
    carry = request.carry
    if request.lot_count != carry.order.lot_count:
        # the volume is reserved in full on the host's disk, sized by the lots paid for: a carry keeps that size
        raise BookingError(
            ngettext(
                "Your data volume was made for %(lots)s lot: carry it with %(lots)s lot, or untick “carry my data” "
                "to book another number of lots with an empty disk.",
                "Your data volume was made for %(lots)s lots: carry it with %(lots)s lots, or untick “carry my "
                "data” to book another number of lots with an empty disk.",
                carry.order.lot_count,
            )
            % {"lots": carry.order.lot_count},
            field="carry_data",
        )
    if window.starts_at < carry.order.ends_at or window.starts_at > carry.kept_until:
        raise BookingError(
            _(
                "Your data can be carried to a window starting between the end of order %(number)s and the "
                "deletion of its files: from %(end)s to %(wipe)s UTC. Choose a start date in that range, or untick "
                "“carry my data”."
            )
            % {
                "number": carry.order.public_id,
                "end": carry.order.ends_at.strftime("%Y-%m-%d %H:%M"),
                "wipe": carry.kept_until.strftime("%Y-%m-%d %H:%M"),
            },
            field="carry_data",
        )
    if selectors.order_data_carried(order=carry.order):
        raise BookingError(
            _("The data of order %(number)s is already carried to another order.") % {"number": carry.order.public_id},
            field="carry_data",
        )
    free = selectors.free_lot_ids(
        hardware_class=request.hardware_class, window=window, limit=request.lot_count, host_id=carry.host_id
    )
    if len(free) < request.lot_count:
        raise BookingError(
            ngettext(
                "Your data stays on the machine that holds it, and only %(free)s lot of %(name)s is free there for "
                "these dates. Choose other dates or fewer lots, or untick “carry my data” to book anywhere with an "
                "empty disk.",
                "Your data stays on the machine that holds it, and only %(free)s lots of %(name)s are free there "
                "for these dates. Choose other dates or fewer lots, or untick “carry my data” to book anywhere with "
                "an empty disk.",
                len(free),
            )
            % {"free": len(free), "name": request.hardware_class.name},
            field="carry_data",
        )


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
    carry = request.carry
    if carry is not None:  # orders first (booking/locks.py): two bookings carrying the same data wait here
        lock_order(carry.order.pk)
    lock_client(email=request.contact.email, client_key=request.client_key)
    lock_capacity(request.hardware_class.pk)
    _check_unpaid_lots(request=request, policy=plan.policy, now=plan.now)
    if carry is not None:
        _check_carry(request=request, window=plan.window)
    lot_ids = selectors.free_lot_ids(
        hardware_class=request.hardware_class,
        window=plan.window,
        limit=request.lot_count,
        host_id=carry.host_id if carry else None,
        ready_within=plan.ready_within,
    )
    if len(lot_ids) < request.lot_count:
        raise SoldOutUnderLock(free=len(lot_ids))
    # after the lots' own answer: confirming an address would not make lots that are taken free
    _check_unconfirmed_share(request=request, policy=plan.policy, window=plan.window)
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
    token = issue_token(order=order)
    OrderEvent.objects.create(
        order=order,
        from_status="",
        to_status=OrderStatus.AWAITING_PAYMENT,
        actor_kind=OrderEvent.Actor.CUSTOMER,
        reason="order placed",
        evidence={"lots": len(lot_ids), "held_until": order.hold_expires_at.isoformat()},
    )
    enqueue.send_order_link(order.pk)
    return order, token


def _check_unpaid_lots(*, request: BookingRequest, policy: BookingPolicy, now: datetime) -> None:
    """Holding lots costs nothing until paid: one e-mail address (once its owner confirmed it) or one client
    address holds at most the policy's number of unpaid lots at a time, across classes. Checked under the
    client's lock (booking/locks.py)."""
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


def _check_unconfirmed_share(*, request: BookingRequest, policy: BookingPolicy, window: selectors.Window) -> None:
    """Holding lots costs nothing until paid, and so do addresses: a confirmed one costs a click in a mailbox of
    one's own, a new one a plus-address. Bookings of contacts who never paid an order (or did not confirm their
    address) may together hold at most the policy's share of the class's lots (rounded down) over the same dates,
    however many e-mail and client addresses they use, so a stranger cannot take a class. The rest is for
    researchers who paid an order before and confirmed their address in the browser they book with. Checked under
    the class lock."""
    if policy.unconfirmed_share_percent >= 100:
        return
    if request.contact_confirmed and selectors.mailbox_has_paid(email=request.contact.email):
        return
    total = selectors.active_lot_count(hardware_class=request.hardware_class)
    limit = total * policy.unconfirmed_share_percent // 100
    held = selectors.unconfirmed_unpaid_lots(hardware_class=request.hardware_class, window=window)
    if held.lots + request.lot_count <= limit:
        return
    figures = {"limit": limit, "total": total, "name": request.hardware_class.name, "held": held.lots}
    message = (
        _(
            "Bookings of researchers who have not paid an order with us yet may hold %(limit)s of the %(total)s "
            "%(name)s lots unpaid over the same dates (%(held)s are held so now): the rest is kept for researchers "
            "who have."
        )
        % figures
    )
    if not request.contact_confirmed:  # whether this mailbox paid before is not said to whoever types it
        message += " " + _(
            "If you paid an order before, confirm your address with the link we e-mail you (open it in this "
            "browser), then book again."
        )
    if held.lots and held.first_release is not None:
        message += " " + _("Or book again after %(frees_at)s UTC, when the first of those holds ends.") % {
            "frees_at": held.first_release.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
        }
    if not request.contact_confirmed:
        raise ConfirmAddressFirst(message)
    raise BookingError(message, field="lots")


def _order_from(plan: OrderPlan) -> Order:
    request = plan.request
    billing = billing_check(request.billing) if request.billing is not None else None
    return Order.objects.create(
        public_id=new_public_id(),
        status=OrderStatus.AWAITING_PAYMENT,
        hardware_class=request.hardware_class,
        environment=request.environment,
        lot_count=request.lot_count,
        days=request.days,
        starts_at=plan.window.starts_at,
        ends_at=plan.window.ends_at,
        start_when_ready=request.start_when_ready,
        contact_name=request.contact.name,
        contact_email=request.contact.email,
        organisation=billing.organisation if billing else request.contact.organisation,
        messenger=request.contact.messenger,
        billing_address=billing.address if billing else "",
        billing_country=billing.country if billing else "",
        vat_number=billing.vat_number if billing else "",
        purchase_order=billing.purchase_order if billing else "",
        sharing=request.research.sharing,
        hypothesis=request.research.hypothesis,
        hypothesis_detail=request.research.detail,
        hypothesis_measure=request.research.measure,
        # Only a 30-day campaign carries a plan: a shorter window keeps none of what the form may have sent.
        checkpoint_interval_hours=(
            request.research.checkpoint_interval_hours if request.days == WindowDays.THIRTY else None
        ),
        stop_criteria=request.research.stop_criteria if request.days == WindowDays.THIRTY else "",
        checkpoint_dir=clean_checkpoint_dir(request.research.checkpoint_dir)
        if request.days == WindowDays.THIRTY
        else "",
        notes=request.notes,
        currency=settings.PRICE_CURRENCY,
        price_per_lot=plan.price_per_lot,
        total_price=plan.price_per_lot * request.lot_count,
        hold_expires_at=plan.now + timedelta(minutes=plan.policy.hold_minutes),
        language=request.language,
        client_key=request.client_key,
        fit_inputs=request.fit_inputs,
        fit_advice=request.fit_advice,
        archcheck_report=request.archcheck_report,
        terms_version_id=request.terms_version_id,
        carry_data_from=request.carry.order if request.carry else None,
        email_verified_at=plan.now if request.contact_confirmed else None,
    )
