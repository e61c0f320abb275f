"""Reads of the booking app: catalog, windows, availability. Each is a fixed number of queries, whatever the
number of lots."""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.db.models import Count, Exists, F, Max, Min, OuterRef, Prefetch, Q, QuerySet, Subquery, Sum
from django.utils import timezone

from booking import availability
from booking.models import (
    PAID_ONCE_STATUSES,
    Allocation,
    BookingPolicy,
    EnvironmentImage,
    Order,
    OrderAccessToken,
    OrderEvent,
    OrderStatus,
    Price,
    mailbox_of,
)
from booking.tokens import token_hash
from inventory.models import HardwareClass, Lot, MaintenanceWindow


@dataclass(frozen=True)
class Window:
    """A research window and the period its lots are held for (turnaround on both sides)."""

    starts_at: datetime
    ends_at: datetime
    held_from: datetime
    held_until: datetime


def window_for(*, start_date: date, days: int, policy: BookingPolicy) -> Window:
    starts_at = datetime.combine(start_date, time.min, tzinfo=UTC)
    ends_at = starts_at + timedelta(days=days)
    return Window(
        starts_at=starts_at,
        ends_at=ends_at,
        held_from=starts_at - policy.turnaround,
        held_until=ends_at + policy.turnaround,
    )


def ready_window(*, starts_at: datetime, days: int, policy: BookingPolicy) -> Window:
    """A window that starts as soon as ready, planned from `starts_at` (a full hour): its lots are held past its
    planned end by the policy's allowance, so that a hand-over that late still gives the full window (its days
    count from the hand-over: booking.services.order_start_clock)."""
    ends_at = starts_at + timedelta(days=days)
    return Window(
        starts_at=starts_at,
        ends_at=ends_at,
        held_from=starts_at - policy.turnaround,
        held_until=ends_at + policy.start_when_ready_allowance + policy.turnaround,
    )


def order_window(*, order: Order, policy: BookingPolicy) -> Window:
    """The window the order holds its lots for: a dated one, or one that starts as soon as ready (with the
    allowance until its clock started)."""
    if order.start_when_ready and order.clock_started_at is None:
        return ready_window(starts_at=order.starts_at, days=order.days, policy=policy)
    return Window(
        starts_at=order.starts_at,
        ends_at=order.ends_at,
        held_from=order.starts_at - policy.turnaround,
        held_until=order.ends_at + policy.turnaround,
    )


def next_full_hour(moment: datetime) -> datetime:
    """The first full hour (UTC) at or after `moment`."""
    moment = moment.astimezone(UTC)
    hour = moment.replace(minute=0, second=0, microsecond=0)
    return hour if hour == moment else hour + timedelta(hours=1)


@dataclass(frozen=True)
class ReadyStart:
    """The earliest window of a class that starts as soon as ready, and how ready its lots' hosts must be for it:
    lots are taken only on hosts ready within `ready_within` of the booking."""

    window: Window
    ready_within: timedelta


def ready_start(
    *, hardware_class: HardwareClass, days: int, lot_count: int, policy: BookingPolicy, now: datetime | None = None
) -> ReadyStart | None:
    """The first full hour at which `lot_count` lots of the class are free on hosts that can be ready by then
    (each host's `ready_within_minutes` after `now`), or None. One query for the hosts' leads, one per distinct
    lead tried (few: operators set them per host)."""
    if not policy.offer_start_when_ready:
        return None
    now = (now or timezone.now()).astimezone(UTC)
    leads = sorted(
        set(
            offered_lots()
            .filter(hardware_class=hardware_class)
            .values_list("host__ready_within_minutes", flat=True)
            .distinct()
        )
    )
    tried: set[datetime] = set()
    for lead in leads:
        starts_at = next_full_hour(now + timedelta(minutes=lead))
        if starts_at in tried:
            continue
        tried.add(starts_at)
        window = ready_window(starts_at=starts_at, days=days, policy=policy)
        ready_within = starts_at - now
        free = len(
            free_lot_ids(hardware_class=hardware_class, window=window, limit=lot_count, ready_within=ready_within)
        )
        if free >= lot_count:
            return ReadyStart(window=window, ready_within=ready_within)
    return None


def order_held_period(*, order: Order) -> tuple[datetime | None, datetime | None]:
    """From when to when the order's lots are held, as its live allocations say (None, None without any): what was
    booked, whatever the policy says today."""
    held = Allocation.objects.filter(order=order).in_use().aggregate(start=Min("starts_at"), end=Max("ends_at"))
    return held["start"], held["end"]


def earliest_start_date(*, policy: BookingPolicy, now: datetime | None = None) -> date:
    """The first date whose 00:00 UTC is at least the minimum notice away."""
    earliest = (now or timezone.now()).astimezone(UTC) + timedelta(hours=policy.min_notice_hours)
    day = earliest.date()
    return day if earliest.time() == time.min else day + timedelta(days=1)


def latest_start_date(*, policy: BookingPolicy, now: datetime | None = None) -> date:
    return (now or timezone.now()).astimezone(UTC).date() + timedelta(days=policy.horizon_days)


def offered_classes() -> QuerySet[HardwareClass]:
    return HardwareClass.objects.filter(is_active=True).prefetch_related(
        Prefetch("prices", queryset=Price.objects.order_by("days")),
        Prefetch(
            "environments",
            queryset=EnvironmentImage.objects.filter(is_active=True).order_by("position", "name"),
        ),
    )


def price_for(*, hardware_class: HardwareClass, days: int) -> Decimal | None:
    """The price per lot, from the prefetched prices when the class came from offered_classes()."""
    for price in hardware_class.prices.all():
        if price.days == days:
            return price.amount_per_lot
    return None


# A lot is offered when it is active, its host is active (the operator's switch) and its host's isolation holds
# (provisioning records it on the host, as `offers_lots`; in the exclusive mode only the host's `exclusive_lot` is
# offered). Booking reads the fields through the relation and knows nothing of how they are found. Dated maintenance
# windows take a host's lots off sale for their dates only: they count as busy, like allocations (_unavailable).
OFFERED_LOT = Q(status=Lot.Status.ACTIVE, host__is_active=True, host__offers_lots=True) & (
    Q(host__exclusive_lot__isnull=True) | Q(host__exclusive_lot=F("pk"))
)


def offered_lots() -> QuerySet[Lot]:
    return Lot.objects.filter(OFFERED_LOT)


def _overlapping_live_allocations(*, held_from: datetime, held_until: datetime) -> QuerySet[Allocation]:
    return Allocation.objects.filter(
        lot=OuterRef("pk"), released_at__isnull=True, starts_at__lt=held_until, ends_at__gt=held_from
    )


def _overlapping_maintenance(*, held_from: datetime, held_until: datetime) -> QuerySet[MaintenanceWindow]:
    return MaintenanceWindow.objects.filter(host=OuterRef("host_id"), starts_at__lt=held_until, ends_at__gt=held_from)


def _unavailable(*, window: Window) -> Q:
    """A lot held by a live allocation, or on a host in maintenance, over any part of the window's held period."""
    period = {"held_from": window.held_from, "held_until": window.held_until}
    return Q(Exists(_overlapping_live_allocations(**period))) | Q(Exists(_overlapping_maintenance(**period)))


@dataclass(frozen=True)
class Availability:
    free: int
    total: int
    # The data disk of a lot, as provisioning makes it (provisioning.container_steps._disk_gib): the operator's size
    # per lot where the host has one (the smallest of the class's offered hosts: what every lot is sure to get), and
    # whether some offered host has none, its volume disk then being split over its lots when the order is prepared.
    disk_gib: int | None = None
    disk_shared: bool = False


# A host whose operator set no disk per lot: its lots share its volume disk (split when an order is prepared).
_SHARED_DISK = Q(host__disk_per_lot_gib=0)


def availability_for_window(*, window: Window) -> dict[int, Availability]:
    """Free and total active lots per hardware class id for the window, with their data disk, in one aggregated
    query."""
    busy = _unavailable(window=window)
    rows = (
        offered_lots()
        .filter(hardware_class__is_active=True)
        .order_by()
        .values("hardware_class_id")
        .annotate(
            total=Count("pk"),
            free=Count("pk", filter=~Q(busy)),
            disk_gib=Min("host__disk_per_lot_gib", filter=~_SHARED_DISK),
            shared=Count("pk", filter=_SHARED_DISK),
        )
    )
    return {
        row["hardware_class_id"]: Availability(
            free=row["free"], total=row["total"], disk_gib=row["disk_gib"], disk_shared=row["shared"] > 0
        )
        for row in rows
    }


@dataclass(frozen=True)
class OrderDisk:
    """The data disk of an order's lots before its machines are prepared: the smallest size per lot their hosts'
    operators set, and whether some host splits its disk over its lots instead (sized when prepared)."""

    per_lot_gib: int | None
    shared: bool


# An order that carries another's data and is still live: it holds that data until its own end.
CARRY_RELEASED = (OrderStatus.EXPIRED, OrderStatus.CANCELLED, OrderStatus.REJECTED)


def order_data_carried(*, order: Order) -> Order | None:
    """The live order that carries this order's data volume, if any."""
    return Order.objects.filter(carry_data_from=order).exclude(status__in=CARRY_RELEASED).first()


def order_disk(*, order: Order) -> OrderDisk:
    """The data disk of the order's live lots (one aggregated query)."""
    found = (
        Allocation.objects.filter(order=order)
        .in_use()
        .aggregate(
            per_lot_gib=Min("lot__host__disk_per_lot_gib", filter=Q(lot__host__disk_per_lot_gib__gt=0)),
            shared=Count("pk", filter=Q(lot__host__disk_per_lot_gib=0)),
        )
    )
    return OrderDisk(per_lot_gib=found["per_lot_gib"], shared=found["shared"] > 0)


def free_lot_ids(
    *,
    hardware_class: HardwareClass,
    window: Window,
    limit: int,
    host_id: int | None = None,
    ready_within: timedelta | None = None,
) -> list[int]:
    """Up to `limit` free lots of the class for the window (on one host, when given; on hosts ready within
    `ready_within`, when given), spread across hosts in a stable order."""
    on_host = {"host_id": host_id} if host_id is not None else {}
    if ready_within is not None:
        on_host["host__ready_within_minutes__lte"] = ready_within // timedelta(minutes=1)
    return list(
        offered_lots()
        .filter(hardware_class=hardware_class, **on_host)
        .filter(~_unavailable(window=window))
        .order_by("host__name", "name")
        .values_list("pk", flat=True)[:limit]
    )


def active_lot_count(*, hardware_class: HardwareClass) -> int:
    return offered_lots().filter(hardware_class=hardware_class).count()


def next_start_dates(
    *,
    hardware_class: HardwareClass,
    lot_count: int,
    days: int,
    after: date,
    policy: BookingPolicy,
    limit: int = 3,
    now: datetime | None = None,
) -> list[date]:
    """The next start dates (from `after`, within the horizon) where `lot_count` lots of the class are free."""
    first = max(after, earliest_start_date(policy=policy, now=now))
    found: list[date] = []
    for day, free in free_lots_by_start_date(
        hardware_class=hardware_class, days=days, first=first, policy=policy, now=now, least=lot_count
    ):
        if free >= lot_count:
            found.append(day)
            if len(found) >= limit:
                break
    return found


def free_lots_by_start_date(
    *,
    hardware_class: HardwareClass,
    days: int,
    first: date,
    policy: BookingPolicy,
    last: date | None = None,
    now: datetime | None = None,
    least: int = 1,
) -> Iterator[tuple[date, int]]:
    """For each start date from `first` to `last` (the horizon's end at most), how many lots of the class are free
    for a window of `days` from it: counts only, nothing of whose they are. Nothing when the class has fewer than
    `least` offered lots.

    Three queries, made before the first date is yielded: the offered lots, their live allocations and their hosts'
    maintenance windows over the dates; the sweep over days is in memory."""
    offered = offered_lots().filter(hardware_class=hardware_class)
    host_of_lot = dict(offered.values_list("pk", "host_id"))
    horizon_end = latest_start_date(policy=policy, now=now)
    last = min(last or horizon_end, horizon_end)
    if len(host_of_lot) < max(least, 1) or first > last:
        return iter(())
    horizon_from = window_for(start_date=first, days=days, policy=policy).held_from
    horizon_until = window_for(start_date=last, days=days, policy=policy).held_until
    periods = list(
        Allocation.objects.filter(
            lot__in=offered.values("pk"),
            released_at__isnull=True,
            starts_at__lt=horizon_until,
            ends_at__gt=horizon_from,
        ).values_list("lot_id", "starts_at", "ends_at")
    )
    lots_of_host: dict[int, list[int]] = {}
    for lot_id, host_id in host_of_lot.items():
        lots_of_host.setdefault(host_id, []).append(lot_id)
    periods += [
        (lot_id, start, end)
        for host_id, start, end in MaintenanceWindow.objects.filter(
            host_id__in=set(lots_of_host), starts_at__lt=horizon_until, ends_at__gt=horizon_from
        ).values_list("host_id", "starts_at", "ends_at")
        for lot_id in lots_of_host[host_id]
    ]
    return _sweep(first=first, last=last, days=days, policy=policy, lots=len(host_of_lot), periods=periods)


CALENDAR_DAYS = 56  # the public calendar: eight weeks from today


@dataclass(frozen=True)
class CalendarDay:
    day: date
    # Lots free for a window of the chosen length from that day (00:00 UTC), None before the earliest dated start.
    free: int | None


def availability_calendar(
    *, hardware_class: HardwareClass, days: int, policy: BookingPolicy, now: datetime | None = None
) -> list[CalendarDay]:
    """The next eight weeks of a class, from today (UTC): per start date, how many lots are free for a window of
    `days` from it. Counts only. Kept in the shared cache until availability or the catalog changes (or a minute
    passes: the earliest date moves with the clock)."""
    now = (now or timezone.now()).astimezone(UTC)
    today = now.date()
    last = today + timedelta(days=CALENDAR_DAYS - 1)

    def compute() -> list:
        counts = free_lots_by_start_date(
            hardware_class=hardware_class,
            days=days,
            first=earliest_start_date(policy=policy, now=now),
            last=last,
            policy=policy,
            now=now,
        )
        return [[day.isoformat(), free] for day, free in counts]

    key = f"booking:calendar:{hardware_class.pk}:{days}:{today.isoformat()}"
    counts = {date.fromisoformat(day): free for day, free in availability.remember(key, compute)}
    dates = [today + timedelta(days=n) for n in range(CALENDAR_DAYS)]
    return [CalendarDay(day=day, free=counts.get(day)) for day in dates]


def _sweep(
    *,
    first: date,
    last: date,
    days: int,
    policy: BookingPolicy,
    lots: int,
    periods: list[tuple[int, datetime, datetime]],
) -> Iterator[tuple[date, int]]:
    day = first
    while day <= last:
        window = window_for(start_date=day, days=days, policy=policy)
        busy = {lot_id for lot_id, start, end in periods if start < window.held_until and end > window.held_from}
        yield day, lots - len(busy)
        day += timedelta(days=1)


EVENTS_PER_PAGE = 50


@dataclass(frozen=True)
class EventsPage:
    """Some of an order's events, oldest first, and the id to ask for the page before them (None: these are the
    first)."""

    events: list[OrderEvent]
    older_than: int | None


def order_events_page(
    *, order: Order, before: int | None = None, transitions_only: bool = False, per_page: int = EVENTS_PER_PAGE
) -> EventsPage:
    """The `per_page` latest events of `order`, or the latest before the event `before` (one of this order's: any
    other id gives an empty page). An order's trail has no bound (a transfer reorganised back and forth, links
    revoked, notes): pages read at most `per_page` + 1 rows. `transitions_only`: the status changes, without the
    notes (what a customer is shown)."""
    events = order.events.select_related("actor")
    if transitions_only:
        events = events.exclude(from_status=F("to_status"))
    if before is not None:
        anchor = order.events.filter(pk=before).values_list("created_at", flat=True).first()
        if anchor is None:
            return EventsPage(events=[], older_than=None)
        events = events.filter(Q(created_at__lt=anchor) | Q(created_at=anchor, pk__lt=before))
    newest_first = list(events.order_by("-created_at", "-pk")[: per_page + 1])
    older_than = newest_first[per_page - 1].pk if len(newest_first) > per_page else None
    return EventsPage(events=newest_first[:per_page][::-1], older_than=older_than)


def with_status_since(orders: QuerySet[Order]) -> QuerySet[Order]:
    """Each order with `status_since`: when it last entered its current status (its audit trail's latest transition
    to it), for the console's queue to say how long each has waited."""
    entered = OrderEvent.objects.filter(order=OuterRef("pk"), to_status=OuterRef("status")).order_by("-created_at")
    return orders.annotate(status_since=Subquery(entered.values("created_at")[:1]))


def order_rejection(order: Order) -> OrderEvent | None:
    """The event that rejected the order (its reason is shown to the customer), if it was rejected."""
    if order.status != OrderStatus.REJECTED:
        return None
    return order.events.filter(to_status=OrderStatus.REJECTED).exclude(from_status=F("to_status")).last()


def order_for_link(*, public_id: str, token: str) -> Order | None:
    """The order behind a secret link, or None: a wrong token and a missing order are indistinguishable."""
    if not public_id or not token or len(public_id) > 16 or len(token) > 128:
        return None
    hashed = token_hash(token)
    return (
        Order.objects.select_related("hardware_class", "environment", "terms_version")
        .filter(public_id=public_id, pk__in=OrderAccessToken.objects.filter(token_hash=hashed).values("order_id"))
        # Whether this link was sent by e-mail (opening it confirms the address: booking.links.link_opened).
        .annotate(link_mailed=Exists(OrderAccessToken.objects.filter(token_hash=hashed, mailed=True)))
        .first()
    )


@dataclass(frozen=True)
class UnpaidLots:
    lots: int
    first_release: datetime | None  # when the earliest of their holds ends


def unpaid_lots_of(*, email: str, client_key: str) -> UnpaidLots:
    """The lots held, unpaid, by orders of this e-mail address's mailbox (s+1@ and s+2@ are one: mailbox_of) whose
    contact confirmed it (opened a link sent there: anyone can type someone else's address), or placed from this
    client address (one query)."""
    same_client = Q(contact_mailbox=mailbox_of(email), email_verified_at__isnull=False)
    if client_key:
        same_client |= Q(client_key=client_key)
    held = Order.objects.filter(same_client, status=OrderStatus.AWAITING_PAYMENT).aggregate(
        lots=Sum("lot_count"), first_release=Min("hold_expires_at")
    )
    return UnpaidLots(lots=held["lots"] or 0, first_release=held["first_release"])


def mailbox_has_paid(*, email: str) -> bool:
    """Whether an order of this address's mailbox was ever paid (one query)."""
    return Order.objects.filter(contact_mailbox=mailbox_of(email), status__in=PAID_ONCE_STATUSES).exists()


def unconfirmed_unpaid_lots(*, hardware_class: HardwareClass, window: Window) -> UnpaidLots:
    """The lots of the class held unpaid, over any part of the window's held period, by orders of contacts who never
    paid an order, or did not confirm their address (one query): what the class-wide share of such holds counts.
    A confirmed address costs a click in a mailbox of one's own, and a new one costs a plus-address: paying once is
    what sets a contact apart from a stranger."""
    mailbox = OuterRef("order__contact_mailbox")
    paid_before = Order.objects.filter(contact_mailbox=mailbox, status__in=PAID_ONCE_STATUSES)
    held = (
        Allocation.objects.filter(
            order__status=OrderStatus.AWAITING_PAYMENT,
            lot__hardware_class=hardware_class,
            released_at__isnull=True,
            starts_at__lt=window.held_until,
            ends_at__gt=window.held_from,
        )
        .exclude(Q(order__email_verified_at__isnull=False) & Exists(paid_before))
        .aggregate(lots=Count("pk"), first_release=Min("order__hold_expires_at"))
    )
    return UnpaidLots(lots=held["lots"] or 0, first_release=held["first_release"])


def orders_for_email(*, email: str, since: datetime) -> QuerySet[Order]:
    return (
        Order.objects.select_related("hardware_class")
        .filter(contact_email__iexact=email, created_at__gte=since)
        .order_by("-created_at")
    )


def split_trial_bars(report: dict) -> dict:
    """Bar heights (0–100) for the order page's split-trial chart: step time and peak memory, one card vs each rank
    of the pair. Values come from a report already validated by booking/split_trial_report.py."""
    single = report.get("single") or {}
    ranks = (report.get("pair") or {}).get("ranks") or []

    def memory(phase: dict) -> float:
        return float(phase.get("peak_memory_mib") or phase.get("peak_rss_mib") or 0)

    if "runs" in report:  # version 2: one bar per completed run
        done = [run for run in report["runs"] if run["status"] == "ok"]
        series = {
            "step_ms": [(run["strategy"], float(run["step_time_ms_median"])) for run in done],
            "comm_ms": [(run["strategy"], float(run.get("comm_time_ms_median") or 0)) for run in done],
            "memory_mib": [  # the fuller card of each run: what must fit
                (run["strategy"], max((float(card.get("peak_memory_mib") or 0) for card in run["per_card"]), default=0))
                for run in done
            ],
        }
    else:
        series = {}
    series = series or {
        "step_ms": [("1 card", float(single.get("step_time_ms_median") or 0))]
        + [(f"rank {rank.get('rank')}", float(rank.get("step_time_ms_median") or 0)) for rank in ranks],
        "comm_ms": [("1 card", 0.0)]
        + [(f"rank {rank.get('rank')}", float(rank.get("comm_time_ms_median") or 0)) for rank in ranks],
        "memory_mib": [("1 card", memory(single))] + [(f"rank {rank.get('rank')}", memory(rank)) for rank in ranks],
    }
    charts = {}
    for name, values in series.items():
        top = max((value for _label, value in values), default=0) or 1
        pitch = 220 / max(len(values), 3)  # three bars (version 1) keep their 70-unit pitch; five fit the 240 width
        charts[name] = [
            {
                "label": label,
                "value": value,
                "height": round(100 * value / top, 1),
                "y": round(110 - 100 * value / top, 1),
                "x": round(20 + pitch * index, 1),
                "width": round(pitch * 0.7, 1),
            }
            for index, (label, value) in enumerate(values)
        ]
    return charts


def lots_free_again(*, order: Order, now: datetime | None = None) -> bool:
    """Whether an expired order's window could be held again now (a read: the re-allocation decides, locked)."""
    now = now or timezone.now()
    policy = BookingPolicy.current()
    if order.start_when_ready and order.clock_started_at is None:  # held again from now: planned anew
        return (
            ready_start(
                hardware_class=order.hardware_class, days=order.days, lot_count=order.lot_count, policy=policy, now=now
            )
            is not None
        )
    window = order_window(order=order, policy=policy)
    return (
        len(free_lot_ids(hardware_class=order.hardware_class, window=window, limit=order.lot_count))
        >= (order.lot_count)
        and order.starts_at > now
    )


# Orders whose lots count as sold in the utilisation report: paid for and not refused.
SOLD_STATUSES = [
    OrderStatus.PAID,
    OrderStatus.APPROVED,
    OrderStatus.PROVISIONING,
    OrderStatus.PROVISIONING_FAILED,
    OrderStatus.READY,
    OrderStatus.ACTIVE,
    OrderStatus.ENDED,
]


@dataclass(frozen=True)
class WeekUse:
    sold: Decimal  # lot-days sold in the week
    available: int  # lot-days the lots could have been sold

    @property
    def percent(self) -> int:
        return round(100 * self.sold / self.available) if self.available else 0


@dataclass(frozen=True)
class UtilisationRow:
    hardware_class: str
    host: str  # "" for the class's total
    weeks: list[WeekUse]


def utilisation_by_week(*, first_week: date, weeks: int) -> tuple[list[date], list[UtilisationRow]]:
    """Lot-days sold and available per hardware class and host, week by week (Monday to Sunday, UTC) from the week
    of `first_week`; each class's rows are followed by its total. Sold: each lot of a paid order, from the window's
    start until the window's end or the lot's release (an early end or a reassignment), whichever comes first.
    Available: the host's active lots on an active host, seven days a week. Two queries."""
    monday = first_week - timedelta(days=first_week.weekday())
    starts = [datetime.combine(monday + timedelta(weeks=index), time.min, tzinfo=UTC) for index in range(weeks)]
    period_end = starts[-1] + timedelta(weeks=1)
    lots: dict[tuple[str, str], int] = {}
    for class_name, host_name in (
        Lot.objects.filter(status=Lot.Status.ACTIVE, host__is_active=True)
        .order_by()
        .values_list("hardware_class__name", "host__name")
    ):
        lots[(class_name, host_name)] = lots.get((class_name, host_name), 0) + 1
    sold: dict[tuple[str, str], list[Decimal]] = {}
    held = Allocation.objects.filter(
        order__status__in=SOLD_STATUSES, order__starts_at__lt=period_end, order__ends_at__gt=starts[0]
    ).values_list(
        "lot__hardware_class__name",
        "lot__host__name",
        "order__starts_at",
        "order__ends_at",
        "released_at",
        "vacated_at",
    )
    day = Decimal(86400)
    for class_name, host_name, begins, ends, released_at, vacated_at in held:
        left = vacated_at or released_at  # the order stopped using the lot then (a move vacates it first)
        if left is not None:
            ends = min(ends, left)
        per_week = sold.setdefault((class_name, host_name), [Decimal(0)] * weeks)
        for index, week_start in enumerate(starts):
            overlap = (min(ends, week_start + timedelta(weeks=1)) - max(begins, week_start)).total_seconds()
            if overlap > 0:
                per_week[index] += Decimal(int(overlap)) / day
    rows: list[UtilisationRow] = []
    for class_name in sorted({key[0] for key in lots} | {key[0] for key in sold}):
        hosts = sorted({host for name, host in {*lots, *sold} if name == class_name})
        totals = [WeekUse(sold=Decimal(0), available=0) for _ in starts]
        for host_name in hosts:
            key = (class_name, host_name)
            uses = [
                WeekUse(sold=round(days, 2), available=lots.get(key, 0) * 7)
                for days in sold.get(key, [Decimal(0)] * weeks)
            ]
            rows.append(UtilisationRow(hardware_class=class_name, host=host_name, weeks=uses))
            totals = [
                WeekUse(sold=t.sold + u.sold, available=t.available + u.available)
                for t, u in zip(totals, uses, strict=True)
            ]
        rows.append(UtilisationRow(hardware_class=class_name, host="", weeks=totals))
    return [start.date() for start in starts], rows
