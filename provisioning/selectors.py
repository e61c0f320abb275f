"""Reads of provisioning: what a host gives each lot's container, and the fleet as the console shows it."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from booking import selectors as booking_selectors
from booking.models import Allocation, Order, OrderStatus
from inventory.models import Host, MaintenanceWindow
from provisioning.models import (
    RETRIED_RUN_KINDS,
    Access,
    GpuReading,
    OperatorSettings,
    ProvisioningRun,
    ProvisioningStep,
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


READINGS_SHOWN = 240  # points per GPU drawn on the order page (the CSV has every minute)


def order_readings(order) -> list[tuple[str, object, list]]:
    """Every minute of the order's GPUs, oldest first: (host name, taken_at, [[index, util, mem, total, W], …])."""
    rows = GpuReading.objects.filter(access__order=order).select_related("access__host").order_by("taken_at", "pk")
    return [(reading.access.host.name, reading.taken_at, reading.gpus) for reading in rows.iterator()]


def readings_chart(order, *, width: int = 600, height: int = 160) -> dict | None:
    """Memory used per GPU over the window, as SVG polylines (one per host GPU), thinned to READINGS_SHOWN points:
    "one card nearly empty, the other saturated" is seen at a glance."""
    rows = list(
        GpuReading.objects.filter(access__order=order)
        .select_related("access__host")
        .order_by("-taken_at")[: READINGS_SHOWN * 8]
    )[::-1]
    if not rows:
        return None
    series: dict[tuple[str, int], list[tuple[float, float, float | None]]] = {}
    first, last = rows[0].taken_at, rows[-1].taken_at
    span = max((last - first).total_seconds(), 60.0)
    for reading in rows:
        x = (reading.taken_at - first).total_seconds() / span * width
        for gpu in reading.gpus if isinstance(reading.gpus, list) else []:
            if not (isinstance(gpu, list) and len(gpu) == 5):
                continue
            index, util, used, total, _power = gpu
            if isinstance(used, int | float) and isinstance(total, int | float) and total > 0:
                series.setdefault((reading.access.host.name, index), []).append((x, used / total, util))
    lines = []
    for (host, index), points in sorted(series.items()):
        step = max(len(points) // READINGS_SHOWN, 1)
        shown = points[::step]
        polyline = " ".join(f"{x:.1f},{height - share * height:.1f}" for x, share, _util in shown)
        peak = max(share for _x, share, _util in points)
        lines.append({"host": host, "gpu": index, "points": polyline, "peak_percent": round(peak * 100)})
    return {"width": width, "height": height, "lines": lines, "first": first, "last": last}


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
