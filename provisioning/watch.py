"""The readings watched while the window runs: one card nearly idle while another is busy (the offer page's own
warning sign of an unbalanced split), or every card idle for hours. Said on the order page while it lasts, and to
the researcher by e-mail as often as they allow (`Order.alert_mails`).

Beat runs it once a minute, after the readings' sample (provisioning.tasks.sample_readings). It reads only what the
hosts' tools reported (GpuReading), never anything of the customer's. A stretch is said only when every minute of
it was read and showed the same thing: a gap in the readings (a host unreachable, a tool that failed) says nothing,
and does not end a stretch either; a minute that reads otherwise ends it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from booking import links, notices
from booking.models import AlertMails, Order, OrderStatus
from booking.notices import Notice
from provisioning import enqueue
from provisioning.gpu_samples import sample_figures
from provisioning.models import Access, GpuReading, OperatorSettings, WatchAlert
from provisioning.selectors import BUSY_PERCENT

BUSY_FROM = 50  # utilisation % from which a card is busy; below BUSY_PERCENT it is nearly idle
COVERAGE = 0.9  # the share of a stretch's minutes that must have been read for it to be said
ORDERS_PER_SWEEP = 2000
MAIL_EVERY = timedelta(days=1)  # AlertMails.DAILY

Card = tuple[str, int]  # (host name, GPU index)


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
    running = list(
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
        _end(alert, now=now)
    return opened


def _end(alert: WatchAlert, *, now: datetime) -> None:
    alert.ended_at = now
    alert.save(update_fields=["ended_at"])


@transaction.atomic
def _open(*, order_id: int, kind: str, since: datetime, newest: Minute, now: datetime) -> bool:
    order = Order.objects.select_for_update().get(pk=order_id)
    if WatchAlert.objects.filter(order=order, kind=kind, ended_at__isnull=True).exists():
        return False  # another sweep opened it meanwhile
    alert = WatchAlert.objects.create(
        order=order,
        kind=kind,
        started_at=since,
        last_seen_at=now,
        idle_cards=sorted(newest.idle),
        busy_cards=sorted(newest.busy),
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
        link=links.order_link(order=order, token=links.issue_token(order=order, mailed=True)),
    )
