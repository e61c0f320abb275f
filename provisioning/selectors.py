"""Reads of provisioning: what a host gives each lot's container, and the fleet as the console shows it."""

from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery

from booking.models import Allocation, Order, OrderStatus
from inventory.models import Host
from provisioning.models import RETRIED_RUN_KINDS, GpuReading, ProvisioningRun, ProvisioningStep

# Orders that hold a host's lots and have been paid for: a host that stops being isolated leaves them in place.
BOOKED_STATUSES = [
    OrderStatus.PAID,
    OrderStatus.APPROVED,
    OrderStatus.PROVISIONING,
    OrderStatus.PROVISIONING_FAILED,
    OrderStatus.READY,
    OrderStatus.ACTIVE,
]


def container_limits(host: Host, *, lots: int = 1) -> dict[str, str]:
    """The operator's share for a container holding `lots` of the host's lots, in the form podman's (and docker's)
    --cpus, --memory and --shm-size take; "" where the operator set none (the steps then split the host's size over
    its lots)."""
    cpus = host.cpus_per_lot
    return {
        "cpus": format((cpus * lots).normalize(), "f") if cpus else "",
        "memory": f"{host.memory_per_lot_gib * lots}g" if host.memory_per_lot_gib else "",
        "shm_size": f"{host.shm_size_gib * lots}g" if host.shm_size_gib else "",
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
    on_unisolated = Q(allocations__lot__host__offers_lots=False, allocations__released_at__isnull=True)
    return Order.objects.filter(on_unisolated, status__in=BOOKED_STATUSES).distinct().order_by("starts_at")[:limit]


def failing_release_runs(*, limit: int = 100) -> QuerySet[ProvisioningRun]:
    """Teardowns, wipes and releases of hosts that failed at least once and have not succeeded since (failed and
    waiting for their next retry, or being retried): one row per run, each with its order and `host_name`, the
    host of its first step not done. Oldest first."""
    step_not_done = ProvisioningStep.objects.filter(run=OuterRef("pk")).exclude(status=ProvisioningStep.Status.DONE)
    return (
        ProvisioningRun.objects.filter(kind__in=RETRIED_RUN_KINDS, attempts__gt=0)
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
