"""Reads of provisioning: what a host gives each lot's container, and the fleet as the console shows it."""

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db.models import Count, Exists, F, Max, Min, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from booking import selectors as booking_selectors
from booking.models import Allocation, Order, OrderStatus
from inventory.models import Host, MaintenanceWindow
from provisioning.gpu_samples import sample_figures
from provisioning.models import (
    RETRIED_RUN_KINDS,
    Access,
    GpuReading,
    OperatorSettings,
    ProvisioningRun,
    ProvisioningStep,
    ResearchRecord,
    WatchAlert,
)

# Orders that hold a host's lots and have been paid for: a host that stops being isolated leaves them in place.
BOOKED_STATUSES = [
    OrderStatus.PAID,
    OrderStatus.APPROVED,
    OrderStatus.PROVISIONING,
    OrderStatus.PROVISIONING_FAILED,
    OrderStatus.READY,
    OrderStatus.ACTIVE,
]


def container_limits(host: Host, *, lots: int = 1) -> dict[str, str | int]:
    """The operator's share for a container holding `lots` of the host's lots, in the form podman's (and docker's)
    --cpus, --memory and --shm-size take, and its tracked connections, terminals and disk bandwidth (MB/s); "" or 0
    where the operator set none (the steps then split the host's size over its lots: provisioning/shares.py)."""
    cpus = host.cpus_per_lot
    return {
        "cpus": format((cpus * lots).normalize(), "f") if cpus else "",
        "memory": f"{host.memory_per_lot_gib * lots}g" if host.memory_per_lot_gib else "",
        "shm_size": f"{host.shm_size_gib * lots}g" if host.shm_size_gib else "",
        "connections": host.connections_per_lot * lots,
        "ptys": host.ptys_per_lot * lots,
        "disk_mbps": host.disk_mbps_per_lot * lots,
    }


def hosts_for_console() -> QuerySet[Host]:
    """Every host with its number of lots and of booked orders still holding them, in one query."""
    booked = Allocation.objects.filter(
        lot__host=OuterRef("pk"), released_at__isnull=True, order__status__in=BOOKED_STATUSES
    )
    return Host.objects.annotate(lot_count=Count("lots", distinct=True), has_booked_orders=Exists(booked)).order_by(
        "name"
    )


def orders_booked_on(*, host: Host) -> QuerySet[Order]:
    """The booked orders that hold one of the host's lots."""
    return (
        Order.objects.filter(
            status__in=BOOKED_STATUSES,
            allocations__lot__host=host,
            allocations__released_at__isnull=True,
        )
        .distinct()
        .order_by("starts_at")
    )


def orders_on_unisolated_hosts(*, limit: int = 100) -> QuerySet[Order]:
    """Booked orders on a host whose last check found it not isolated: the console flags them for an operator
    (they are not cancelled)."""
    on_unisolated = Q(
        allocations__lot__host__offers_lots=False,
        allocations__released_at__isnull=True,
        allocations__vacated_at__isnull=True,
    )
    return Order.objects.filter(on_unisolated, status__in=BOOKED_STATUSES).distinct().order_by("starts_at")[:limit]


@dataclass(frozen=True)
class OrderToMove:
    """A placed order holding a host's lots over dates the host is off sale: the operator moves it (reassigns its
    lots) or ends the maintenance. `maintenance` is the overlapping window, or None when the host is inactive."""

    order: Order
    host: Host
    maintenance: MaintenanceWindow | None


def orders_to_move(*, host: Host | None = None, now: datetime | None = None, limit: int = 100) -> list[OrderToMove]:
    """Orders placed (paid or not) whose live allocation is on an inactive host or overlaps a maintenance window of
    its host, and has not ended yet: one row per order and host, soonest first. Two queries."""
    now = now or timezone.now()
    overlapping = MaintenanceWindow.objects.filter(
        host=OuterRef("lot__host"), starts_at__lt=OuterRef("ends_at"), ends_at__gt=OuterRef("starts_at")
    ).order_by("starts_at", "pk")
    allocations = (
        Allocation.objects.in_use()
        .filter(ends_at__gt=now)
        .annotate(maintenance_id=Subquery(overlapping.values("pk")[:1]))
        .filter(Q(lot__host__is_active=False) | Q(maintenance_id__isnull=False))
        .select_related("order__hardware_class", "lot__host")
        .order_by("starts_at", "order_id", "lot__host__name")
    )
    if host is not None:
        allocations = allocations.filter(lot__host=host)
    rows: dict[tuple[int, int], tuple[Allocation, int | None]] = {}
    for allocation in allocations[: limit * 8]:
        key = (allocation.order_id, allocation.lot.host_id)
        if key not in rows and len(rows) < limit:
            rows[key] = (allocation, allocation.maintenance_id)
    windows = MaintenanceWindow.objects.in_bulk({pk for _allocation, pk in rows.values() if pk})
    return [
        OrderToMove(
            order=allocation.order,
            host=allocation.lot.host,
            maintenance=None if not allocation.lot.host.is_active else windows.get(maintenance_id),
        )
        for allocation, maintenance_id in rows.values()
    ]


def failing_release_runs(*, limit: int = 100) -> QuerySet[ProvisioningRun]:
    """Teardowns, wipes, releases of hosts and moves that failed at least once and have not succeeded since (failed
    and waiting for their next retry, or being retried), unless given up: one row per run, each with its order and
    `host_name`, the host of its first step not done. Oldest first."""
    step_not_done = ProvisioningStep.objects.filter(run=OuterRef("pk")).exclude(status=ProvisioningStep.Status.DONE)
    return (
        ProvisioningRun.objects.filter(kind__in=RETRIED_RUN_KINDS, attempts__gt=0, given_up_at__isnull=True)
        .exclude(status=ProvisioningRun.Status.SUCCEEDED)
        .select_related("order")
        .annotate(host_name=Subquery(step_not_done.order_by("position").values("host__name")[:1]))
        .order_by("created_at", "pk")[:limit]
    )


READINGS_SHOWN = 240  # points per GPU drawn on the order page, each the mean of its stretch (the CSV has every minute)
MEASURES = ("utilisation", "memory", "power", "temperature")  # the order page's charts, in this order
READINGS_CACHE_S = 600  # a summary is kept per order and newest reading: a new minute makes a new one


def order_readings(order) -> Iterator[tuple[str, datetime, list]]:
    """Every minute of the order's GPUs, oldest first: (host name, taken_at, [[index, util, mem, total, W, °C], …]),
    each figure a number or None, whatever was stored."""
    rows = GpuReading.objects.filter(access__order=order).order_by("taken_at", "pk")
    for host, taken_at, gpus in rows.values_list("access__host__name", "taken_at", "gpus").iterator(chunk_size=2000):
        samples = [sample_figures(gpu) for gpu in gpus] if isinstance(gpus, list) else []
        yield host, taken_at, [sample for sample in samples if sample is not None]


@dataclass
class CardReadings:
    """One card's minutes, summed per stretch of the window (`points` stretches) and over all of it."""

    host: str
    gpu: int
    sums: dict[str, list[float]]  # per measure, per stretch: the sum of its figures
    counts: dict[str, list[int]]  # how many figures each sum holds
    peak: dict[str, float]
    total: dict[str, float]  # the sum over the window
    count: dict[str, int]
    minutes: int = 0  # minutes read
    busy_minutes: int = 0  # minutes at 5 % utilisation or more

    def mean(self, measure: str) -> float | None:
        return self.total[measure] / self.count[measure] if self.count[measure] else None

    @property
    def energy_kwh(self) -> float:
        """Power read once a minute, each reading standing for its minute."""
        return self.total["power"] / 60 / 1000


@dataclass
class ReadingsSummary:
    first: datetime
    last: datetime
    points: int
    cards: list[CardReadings]


BUSY_PERCENT = 5  # a card at less than this is idle (the imbalance watch and the record say the same)


def readings_summary(order, *, points: int = READINGS_SHOWN) -> ReadingsSummary | None:
    """Every minute of the order's cards read once, in a single pass over its readings (a 30-day window holds 43,200
    per access): per card and measure, the mean of each of `points` stretches, the peak, the mean and the energy.
    Memory is a share of the card's own total (%). Kept in the cache until a newer reading is stored."""
    readings = GpuReading.objects.filter(access__order=order)
    bounds = readings.aggregate(first=Min("taken_at"), last=Max("taken_at"), newest=Max("pk"))
    if bounds["newest"] is None:
        return None
    key = f"readings-summary:{order.pk}:{bounds['newest']}:{points}"
    if (kept := cache.get(key)) is not None:  # the cache holds JSON
        return ReadingsSummary(
            first=datetime.fromisoformat(kept["first"]),
            last=datetime.fromisoformat(kept["last"]),
            points=kept["points"],
            cards=[CardReadings(**card) for card in kept["cards"]],
        )
    first, last = bounds["first"], bounds["last"]
    span = max((last - first).total_seconds(), 60.0)
    cards: dict[tuple[str, int], CardReadings] = {}
    rows = readings.order_by().values_list("access__host__name", "taken_at", "gpus")
    for host, taken_at, gpus in rows.iterator(chunk_size=2000):
        stretch = min(int((taken_at - first).total_seconds() / span * points), points - 1)
        for gpu in gpus if isinstance(gpus, list) else []:
            if (figures := sample_figures(gpu)) is None:
                continue
            index, util, used, total, power, temperature = figures
            # a share of the card's own memory: none where the figures cannot be one (a total under 1 MiB, more used
            # than the card holds), so no stored pair makes it infinite or absurd
            memory = (
                used / total * 100 if used is not None and total is not None and total >= 1 and used <= total else None
            )
            card = cards.get((host, index))
            if card is None:
                card = cards[(host, index)] = CardReadings(
                    host=host,
                    gpu=index,
                    sums={measure: [0.0] * points for measure in MEASURES},
                    counts={measure: [0] * points for measure in MEASURES},
                    peak=dict.fromkeys(MEASURES, 0.0),
                    total=dict.fromkeys(MEASURES, 0.0),
                    count=dict.fromkeys(MEASURES, 0),
                )
            card.minutes += 1
            card.busy_minutes += util is not None and util >= BUSY_PERCENT
            for measure, value in zip(MEASURES, (util, memory, power, temperature), strict=True):
                if value is None:
                    continue
                card.sums[measure][stretch] += value
                card.counts[measure][stretch] += 1
                card.peak[measure] = max(card.peak[measure], value)
                card.total[measure] += value
                card.count[measure] += 1
    summary = ReadingsSummary(first=first, last=last, points=points, cards=[cards[key] for key in sorted(cards)])
    kept = {**asdict(summary), "first": first.isoformat(), "last": last.isoformat()}
    cache.set(key, kept, timeout=READINGS_CACHE_S)
    return summary


def readings_charts(order, *, width: int = 600, height: int = 160) -> dict | None:
    """Utilisation, memory, power and temperature per card over the window, as SVG polylines (one per card and
    measure): "one card nearly empty, the other saturated" is seen at a glance. Utilisation and memory are drawn on
    0-100 %, power up to the highest reading (in hundreds of watts), temperature up to 100 °C or the hottest."""
    summary = readings_summary(order)
    if summary is None or not summary.cards:
        return None
    charts = []
    for measure in MEASURES:
        if not any(card.count[measure] for card in summary.cards):
            continue  # the tool gave no such figure (an older reading, a card that does not report it)
        peak = max(card.peak[measure] for card in summary.cards)
        top = {"power": max(100.0, -(-peak // 100) * 100), "temperature": max(100.0, -(-peak // 10) * 10)}.get(
            measure, 100.0
        )
        lines = []
        for card in summary.cards:
            xy = [
                (stretch / max(summary.points - 1, 1) * width, total / count)
                for stretch, (total, count) in enumerate(zip(card.sums[measure], card.counts[measure], strict=True))
                if count
            ]
            polyline = " ".join(f"{x:.1f},{height - min(value / top, 1.0) * height:.1f}" for x, value in xy)
            mean = card.mean(measure)
            lines.append(
                {
                    "host": card.host,
                    "gpu": card.gpu,
                    "points": polyline,
                    "peak": round(card.peak[measure]),
                    "mean": round(mean) if mean is not None else None,
                }
            )
        charts.append({"measure": measure, "top": round(top), "lines": lines})
    return {"width": width, "height": height, "first": summary.first, "last": summary.last, "charts": charts}


def order_watch_alerts(order, *, limit: int = 10) -> list[WatchAlert]:
    """The order's alerts from its readings, the open ones first, then the newest."""
    return list(
        WatchAlert.objects.filter(order=order).order_by(F("ended_at").desc(nulls_first=True), "-started_at")[:limit]
    )


def order_checkpoint_state(order) -> Access | None:
    """The latest reading of the order's checkpoint directory (its containers' newest), or None before the first."""
    if not order.checkpoint_dir:
        return None
    read = order.accesses.filter(checkpoint_checked_at__isnull=False, checkpoint_dir_read=order.checkpoint_dir)
    return read.order_by(F("checkpoint_newest_at").desc(nulls_last=True), "-checkpoint_checked_at").first()


def order_research_record(order) -> ResearchRecord | None:
    """The order's signed research record, while its files are kept (it goes with them)."""
    return ResearchRecord.objects.filter(order=order).first()


# An order whose data volume may be carried to a next order: its machines were prepared (or its window ran).
DATA_KEPT_STATUSES = (OrderStatus.READY, OrderStatus.ACTIVE, OrderStatus.ENDED)


def keys_can_change(order: Order) -> bool:
    """Whether the order's keys still open something, or will: before and during the window, and after its end while
    its files are kept (the download window takes them). Not once every host deleted its files."""
    if not order.keys_can_change:
        return False
    return order.status != OrderStatus.ENDED or order.accesses.filter(wiped_at__isnull=True).exists()


def kept_data_access(order: Order) -> Access | None:
    """The access whose data volume is still on its host, not wiped, when the order has exactly one (a volume is
    carried to a next order on its own host; an order spread over several hosts has one per host, and none is
    offered). None once the volume was carried to another live order: it left the order then."""
    if order.status not in DATA_KEPT_STATUSES:
        return None
    kept = list(order.accesses.filter(disk_gib__isnull=False, wiped_at__isnull=True).select_related("host")[:2])
    if len(kept) != 1 or booking_selectors.order_data_carried(order=order) is not None:
        return None
    return kept[0]


def carried_volume_username(order: Order, *, host: Host) -> str:
    """The account on `host` whose data volume `order` takes over (the order it carries the data of), or "". Wiped
    or not: a volume that is gone fails the step that takes it over, it is not silently replaced by an empty one."""
    if order.carry_data_from_id is None:
        return ""
    source = Access.objects.filter(order_id=order.carry_data_from_id, host=host).first()
    return source.username if source else ""


@dataclass(frozen=True)
class ApprovalOutlook:
    """What a paid order waits for, as the operator set it: the order page and the payment e-mail say it."""

    automatic: bool  # approved as soon as paid (OperatorSettings.auto_approve)
    within_hours: int  # else the operator's stated response time
    lead_hours: int  # the machines are prepared this long before the window
    prepared_from: datetime  # the window's start less the lead: when preparation starts at the earliest


def approval_outlook(order: Order) -> ApprovalOutlook:
    current = OperatorSettings.read()
    return ApprovalOutlook(
        automatic=current.auto_approve,
        within_hours=current.approval_response_hours,
        lead_hours=current.provision_lead_hours,
        prepared_from=order.starts_at - timedelta(hours=current.provision_lead_hours),
    )


def with_approval_late(orders: list[Order], *, now: datetime) -> list[Order]:
    """Each order (annotated with `status_since`) with `approval_late`: paid, and waiting for approval longer than
    the operator's stated response time; never when approval is automatic."""
    for order in orders:
        order.approval_late = False
    paid = [order for order in orders if order.status == OrderStatus.PAID and order.status_since is not None]
    if not paid:  # the settings are read only when some order waits for approval
        return orders
    current = OperatorSettings.read()
    late_after = timedelta(hours=current.approval_response_hours)
    for order in paid:
        order.approval_late = not current.auto_approve and now - order.status_since > late_after
    return orders


def wipe_date(order: Order) -> datetime:
    """When the customer's files are deleted: announced in the end-of-window e-mails, and the last start of a
    window that carries them."""
    return order.ends_at + timedelta(days=OperatorSettings.current().wipe_after_days)


def host_port_span(host: Host) -> int:
    """How many window ports the host's lots use from its first customer port: its highest GPU index + 1."""
    indices = [index for lot in host.lots.all() for index in lot.gpu_index_list]
    return max(indices, default=0) + 1
