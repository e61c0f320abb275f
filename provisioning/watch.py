"""The readings watched while the window runs: one card nearly idle while another is busy (the offer page's own
warning sign of an unbalanced split), or every card idle for hours; and the checkpoints where the researcher said
they are written (`watch_checkpoints`). Said on the order page while it lasts, and to the researcher by e-mail as
often as they allow (`Order.alert_mails`).

Beat runs the readings' watch once a minute, after the readings' sample (provisioning.tasks.sample_readings), and the
checkpoint watch every few minutes (provisioning.tasks.watch_checkpoints). The readings' watch reads only what the
hosts' tools reported (GpuReading), never anything of the customer's. A stretch is said only when every minute of
it was read and showed the same thing: a gap in the readings (a host unreachable, a tool that failed) says nothing,
and does not end a stretch either; a minute that reads otherwise ends it.
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from booking import links, notices
from booking.models import AlertMails, Order, OrderStatus
from booking.notices import Notice
from inventory.models import Host
from provisioning import containers, enqueue
from provisioning.drivers.base import DriverError
from provisioning.gpu_samples import sample_figures
from provisioning.hosts import host_connect
from provisioning.models import Access, GpuReading, OperatorSettings, WatchAlert
from provisioning.selectors import BUSY_PERCENT

BUSY_FROM = 50  # utilisation % from which a card is busy; below BUSY_PERCENT it is nearly idle
COVERAGE = 0.9  # the share of a stretch's minutes that must have been read for it to be said
ORDERS_PER_SWEEP = 2000
MAIL_EVERY = timedelta(days=1)  # AlertMails.DAILY

Card = tuple[str, int]  # (host name, GPU index)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Minute:
    idle: frozenset[Card]
    busy: frozenset[Card]
    cards: int  # cards with a utilisation figure

    @property
    def unbalanced(self) -> bool:
        return bool(self.idle) and bool(self.busy)

    @property
    def all_idle(self) -> bool:
        return self.cards > 0 and len(self.idle) == self.cards


def _minutes(rows) -> dict[int, dict[datetime, Minute]]:
    """Per order, per minute: which of its cards were nearly idle and which busy (every access of the order, its
    hosts read in the same sweep, counted together)."""
    cards: dict[int, dict[datetime, dict[Card, float]]] = defaultdict(lambda: defaultdict(dict))
    for order_id, host, taken_at, gpus in rows:
        for gpu in gpus if isinstance(gpus, list) else []:
            figures = sample_figures(gpu)
            if figures is not None and figures[1] is not None:
                cards[order_id][taken_at][(host, figures[0])] = figures[1]
    return {
        order_id: {
            taken_at: Minute(
                idle=frozenset(card for card, util in read.items() if util < BUSY_PERCENT),
                busy=frozenset(card for card, util in read.items() if util >= BUSY_FROM),
                cards=len(read),
            )
            for taken_at, read in minutes.items()
        }
        for order_id, minutes in cards.items()
    }


def _stretch(minutes: dict[datetime, Minute], *, now: datetime, length: timedelta, shows) -> datetime | None:
    """The start of the stretch of `length` up to `now` when its first minute and enough of the others were read,
    and every one read `shows`; None otherwise."""
    since = now - length
    inside = [taken_at for taken_at in minutes if taken_at > since]
    if len(inside) < COVERAGE * (length / timedelta(minutes=1)) or min(inside) - since > timedelta(minutes=1):
        return None
    return min(inside) if all(shows(minutes[taken_at]) for taken_at in inside) else None


def watch_readings(*, now: datetime | None = None) -> int:
    """Open, keep or end each running order's alerts from its readings. Returns how many alerts were opened."""
    now = now or timezone.now()
    current = OperatorSettings.current()
    lengths = {
        WatchAlert.Kind.IMBALANCE: (timedelta(minutes=current.imbalance_minutes), lambda minute: minute.unbalanced),
        WatchAlert.Kind.IDLE: (timedelta(hours=current.idle_hours), lambda minute: minute.all_idle),
    }
    running = set(
        Order.objects.filter(status__in=[OrderStatus.READY, OrderStatus.ACTIVE], accesses__status=Access.Status.READY)
        .distinct()
        .values_list("pk", flat=True)[:ORDERS_PER_SWEEP]
    )
    longest = max(length for length, _shows in lengths.values())
    rows = GpuReading.objects.filter(access__order__in=running, taken_at__gt=now - longest, taken_at__lte=now)
    by_order = _minutes(rows.values_list("access__order_id", "access__host__name", "taken_at", "gpus").iterator())
    opened = 0
    open_alerts = {(alert.order_id, alert.kind): alert for alert in WatchAlert.objects.filter(ended_at__isnull=True)}
    for order_id in running:
        minutes = by_order.get(order_id, {})
        newest = minutes[max(minutes)] if minutes else None
        for kind, (length, shows) in lengths.items():
            alert = open_alerts.pop((order_id, kind), None)
            since = _stretch(minutes, now=now, length=length, shows=shows)
            if alert is None and since is not None:
                opened += _open(order_id=order_id, kind=kind, since=since, newest=newest, now=now)
            elif alert is not None and newest is not None and shows(newest):
                alert.last_seen_at = max(minutes)
                alert.idle_cards, alert.busy_cards = sorted(newest.idle), sorted(newest.busy)
                alert.save(update_fields=["last_seen_at", "idle_cards", "busy_cards"])
            elif alert is not None and newest is not None:  # the newest minute reads otherwise
                _end(alert, now=now)
    for alert in open_alerts.values():  # the window stopped running (ended, cancelled, moved away)
        if alert.kind != WatchAlert.Kind.CHECKPOINT or alert.order_id not in running:
            _end(alert, now=now)
    return opened


def _end(alert: WatchAlert, *, now: datetime) -> None:
    alert.ended_at = now
    alert.save(update_fields=["ended_at"])


@transaction.atomic
def _open(*, order_id: int, kind: str, since: datetime, newest: Minute | None, now: datetime) -> bool:
    order = Order.objects.select_for_update().get(pk=order_id)
    if WatchAlert.objects.filter(order=order, kind=kind, ended_at__isnull=True).exists():
        return False  # another sweep opened it meanwhile
    alert = WatchAlert.objects.create(
        order=order,
        kind=kind,
        started_at=since,
        last_seen_at=now,
        idle_cards=sorted(newest.idle) if newest else [],
        busy_cards=sorted(newest.busy) if newest else [],
    )
    if _may_mail(order=order, kind=kind, now=now):
        alert.mailed_at = now
        alert.save(update_fields=["mailed_at"])
        enqueue.send_watch_alert(order.pk, alert.pk)
    return True


def _may_mail(*, order: Order, kind: str, now: datetime) -> bool:
    """As often as the researcher allows: never, once per window, or at most once a day, per kind."""
    mailed = WatchAlert.objects.filter(order=order, kind=kind, mailed_at__isnull=False)
    if order.alert_mails == AlertMails.OFF:
        return False
    if order.alert_mails == AlertMails.ONCE:
        return not mailed.exists()
    return not mailed.filter(mailed_at__gt=now - MAIL_EVERY).exists()


# The checkpoint watch. Inside the customer's container, as the customer (never on the host, never as root): the image's
# own sh, find and awk (the image is the catalog's, read-only), bounded by `timeout`. find -P never follows a link, and
# with -type f it only stats the directory's entries (a FIFO is never opened, a link never followed); awk keeps the
# largest time in one pass, so a million files cost one pass and print one number. The directory comes in as $1,
# never as shell text. What comes back is one line, read as hostile: an integer, or a word.
CHECKPOINT_SCRIPT = (
    'cd "$HOME" 2>/dev/null || { echo unreadable; exit 0; }; '
    'd="./$1"; '  # a path, never an option or an expression of find's, whatever the name (also refused at input)
    'if [ -L "$d" ] || [ ! -d "$d" ]; then echo notdir; exit 0; fi; '
    "find -P \"$d\" -mindepth 1 -maxdepth 1 -type f -printf '%T@\\n' 2>/dev/null | "
    "awk 'BEGIN { newest = -1 } $1 + 0 > newest { newest = $1 + 0 } END { printf \"%d\\n\", newest }'"
)
CHECKPOINT_TIMEOUT_S = 20
CHECKPOINT_READ = re.compile(r"(-1|\d{1,12}|notdir|unreadable)")
CHECKPOINT_HOSTS_PER_SWEEP = 50
RENAMED_READ_AFTER = timedelta(hours=1)
SWEEP_BUDGET_S = 120  # past this, the hosts left are read at the next sweep (beat asks every 5 minutes)


def checkpoint_argv(runtime: containers.Runtime, *, username: str, directory: str) -> list[str]:
    customer = f"{containers.CUSTOMER_ID}:{containers.CUSTOMER_ID}"
    home = f"/home/{username}"
    return runtime.command(
        "exec", "--user", customer, "--workdir", home, "--env", f"HOME={home}", f"binome-{username}",
        "timeout", str(CHECKPOINT_TIMEOUT_S), "/bin/sh", "-c", CHECKPOINT_SCRIPT, "sh", directory,
    )  # fmt: skip


def checkpoint_reading(stdout: str, exit_status: int) -> tuple[str, datetime | None]:
    """("ok", newest time), ("none", None) for a directory without files, ("not a directory", None), or
    ("unreadable", None) for anything else (a timeout, a failed exec, garbage)."""
    answer = stdout[:64].strip()
    if exit_status != 0 or not CHECKPOINT_READ.fullmatch(answer):
        return "unreadable", None
    if answer == "notdir":
        return "not a directory", None
    if answer == "unreadable":
        return "unreadable", None
    if answer == "-1":
        return "none", None
    try:
        return "ok", datetime.fromtimestamp(int(answer), tz=UTC)
    except (OverflowError, OSError, ValueError):
        return "unreadable", None


def watch_checkpoints(*, now: datetime | None = None) -> dict[str, int]:
    """Beat's checkpoint watch: each running container of an order that named a checkpoint directory is read once per
    interval (a directory named anew within the hour), the least recently read first, within SWEEP_BUDGET_S; an
    order whose newest checkpoint (or its hand-over, when none was seen) is older than twice the interval gets a
    `checkpoint` alert, ended by the first newer file. A container that did not answer says nothing."""
    now = now or timezone.now()
    started = time.monotonic()
    # a watch the researcher turned off says nothing more
    for alert in WatchAlert.objects.filter(
        kind=WatchAlert.Kind.CHECKPOINT, ended_at__isnull=True, order__checkpoint_dir=""
    ):
        _end(alert, now=now)
    watched = (
        Access.objects.filter(
            status=Access.Status.READY,
            order__status__in=[OrderStatus.READY, OrderStatus.ACTIVE],
            host__driver=Host.Driver.SSH,
        )
        .exclude(order__checkpoint_dir="")
        .exclude(host__container_runtime="")
        .select_related("host", "order")
        .order_by(F("checkpoint_checked_at").asc(nulls_first=True), "pk")  # the least recently read first
    )
    by_host: dict[int, list[Access]] = defaultdict(list)
    for access in watched[: CHECKPOINT_HOSTS_PER_SWEEP * 16]:
        hours = access.order.checkpoint_watch_interval_hours
        since = now - access.checkpoint_checked_at if access.checkpoint_checked_at else None
        if hours and (
            since is None
            or since >= timedelta(hours=hours)
            # a directory named anew: read within the hour, however often it is changed
            or (access.checkpoint_dir_read != access.order.checkpoint_dir and since >= RENAMED_READ_AFTER)
        ):
            by_host[access.host_id].append(access)
    counts: dict[str, int] = defaultdict(int)
    answered: set[int] = set()  # orders with a container that answered this sweep
    for accesses in list(by_host.values())[:CHECKPOINT_HOSTS_PER_SWEEP]:
        if time.monotonic() - started > SWEEP_BUDGET_S:
            counts["left for the next sweep"] += len(accesses)
            continue
        host = accesses[0].host
        try:
            with host_connect(host=host) as connection:
                for position, access in enumerate(accesses):
                    if time.monotonic() - started > SWEEP_BUDGET_S:
                        counts["left for the next sweep"] += len(accesses) - position
                        break
                    read = _checkpoint_read(connection, containers.Runtime(host.container_runtime), access, now=now)
                    counts["unreadable" if read == "broke" else read] += 1
                    if read == "broke":  # the session may be gone: the rest of the host waits for the next sweep,
                        counts["left for the next sweep"] += len(accesses) - position - 1  # where it comes first
                        break
                    if read != "unreadable":
                        answered.add(access.order_id)
        except DriverError as exc:
            logger.warning("checkpoint watch: %s unreachable: %s", host.name, exc.message)
            counts["unreachable"] += 1
    for order_id in answered:
        counts["late"] += _checkpoints_judge(order_id=order_id, now=now)
    return dict(counts)


def _checkpoint_read(connection, runtime: containers.Runtime, access: Access, *, now: datetime) -> str:
    """Read one container's checkpoint directory and keep what it said. A container that does not answer in time,
    or a session that broke, is kept as "unreadable" for this interval (read again at the next, after the others):
    "broke" tells the sweep to leave the rest of the host, unread, for its next run, where they come first."""
    argv = checkpoint_argv(runtime, username=access.username, directory=access.order.checkpoint_dir)
    broke = False
    try:
        result = connection.run(argv, check=False, timeout=CHECKPOINT_TIMEOUT_S + 10)
    except DriverError as exc:
        logger.warning("checkpoint watch: %s on %s: %s", access.username, access.host.name, exc.message)
        read, newest, broke = "unreadable", None, True
    else:
        read, newest = checkpoint_reading(result.stdout, result.exit_status)
    Access.objects.filter(pk=access.pk).update(
        checkpoint_checked_at=now,
        checkpoint_newest_at=newest,
        checkpoint_read=read,
        checkpoint_dir_read=access.order.checkpoint_dir,
    )
    return "broke" if broke else read


def _checkpoints_judge(*, order_id: int, now: datetime) -> int:
    """Open or end the order's `checkpoint` alert from what its containers' readings say (those that answered).
    Returns 1 if opened."""
    order = Order.objects.get(pk=order_id)
    accesses = list(
        order.accesses.filter(
            status=Access.Status.READY, checkpoint_checked_at__isnull=False, checkpoint_dir_read=order.checkpoint_dir
        ).exclude(checkpoint_read="unreadable")
    )
    if not accesses or not order.checkpoint_watch_interval_hours:
        return 0
    seen = [access.checkpoint_newest_at for access in accesses if access.checkpoint_newest_at is not None]
    handed_over = min((access.ready_at for access in accesses if access.ready_at), default=order.starts_at)
    since = max([*seen, handed_over, order.starts_at])
    late = now - since > 2 * timedelta(hours=order.checkpoint_watch_interval_hours)
    alert = WatchAlert.objects.filter(order=order, kind=WatchAlert.Kind.CHECKPOINT, ended_at__isnull=True).first()
    if alert is None and late:
        return int(_open(order_id=order.pk, kind=WatchAlert.Kind.CHECKPOINT, since=since, newest=None, now=now))
    if alert is not None and not late:
        _end(alert, now=now)
    elif alert is not None:
        alert.last_seen_at = now
        alert.save(update_fields=["last_seen_at"])
    return 0


def watch_alert_send(*, order: Order, alert: WatchAlert) -> None:
    """The e-mail of an alert (in the task: the link's secret never travels through the broker). Not sent when
    the researcher turned the e-mails off after the alert was opened."""
    if order.alert_mails == AlertMails.OFF:
        return
    current = OperatorSettings.current()
    notices.send(
        Notice.WATCH_ALERT,
        order=order,
        alert=alert,
        minutes=current.imbalance_minutes,
        hours=current.idle_hours,
        link=links.mailed_order_link(order=order),
    )
