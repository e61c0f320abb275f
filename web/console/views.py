"""The operator console: a queue by state, each order's runs and actions, a calendar of lots. Staff with the
"operate orders" permission only; every action goes through a service and leaves an OrderEvent."""

from datetime import UTC, date, datetime, time, timedelta
from functools import wraps

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRefresh

from booking import services as booking_services
from booking.models import Allocation, BookingPolicy, Order, OrderStatus
from booking.rules import BookingError
from booking.selectors import free_lot_ids, order_events_page, order_window, utilisation_by_week, with_status_since
from infrastructure.numbers import whole_number
from inventory.models import Host, Lot
from payments import checkout, unapplied
from payments.chain import ChainUnavailable
from payments.errors import PaymentError
from payments.ledger import dust_threshold
from payments.models import Invoice, Refund
from payments.refund_proofs import MESSAGES as REFUND_TX_MESSAGES
from payments.refund_proofs import RefundTxOutcome, refund_credit_tx
from payments.selectors import (
    flagged_payments,
    format_units,
    money_held_or_owed,
    open_refunds,
    order_refunds,
    revenue_by_month,
)
from provisioning import moves, rules, runs, selectors, services
from provisioning.admin import request_host_checks

OPERATE = "booking.operate_orders"


def operator_required(view):
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not (request.user.is_staff and request.user.has_perm(OPERATE)):
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return wrapper


QUEUE = [
    ("paid", gettext_lazy("Paid, awaiting approval"), [OrderStatus.PAID]),
    ("provisioning", gettext_lazy("Provisioning"), [OrderStatus.APPROVED, OrderStatus.PROVISIONING]),
    ("failed", gettext_lazy("Provisioning failed"), [OrderStatus.PROVISIONING_FAILED]),
    ("ready", gettext_lazy("Ready"), [OrderStatus.READY]),
    ("active", gettext_lazy("Active"), [OrderStatus.ACTIVE]),
]


@require_GET
@operator_required
def queue(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    orders = selectors.with_approval_late(
        list(
            with_status_since(
                Order.objects.filter(status__in=[status for _key, _label, statuses in QUEUE for status in statuses])
            )
            .select_related("hardware_class")
            .order_by("starts_at")[:500]
        ),
        now=now,
    )
    sections = [
        {"key": key, "label": label, "orders": [order for order in orders if order.status in statuses]}
        for key, label, statuses in QUEUE
    ]
    ending = [o for o in orders if o.status == OrderStatus.ACTIVE and o.ends_at - now <= timedelta(hours=48)]
    sections.insert(5, {"key": "ending", "label": _("Ending within 48 h"), "orders": ending})
    unisolated = list(selectors.orders_on_unisolated_hosts())
    failing = list(selectors.failing_release_runs())
    context = {
        "sections": sections,
        "unisolated": unisolated,
        "failing": failing,
        "to_move": selectors.orders_to_move(now=now),
        "now": now,
    }
    if request.htmx:
        return render(request, "console/queue.html#queue", context)
    # Outside the polled region, as the refunds are: an action's button must not be swapped under the click.
    return render(
        request,
        "console/queue.html",
        {
            **context,
            "refunds": open_refunds(page=_page_number(request, "refunds_page")),
            "flagged": flagged_payments(page=_page_number(request, "flagged_page")),
        },
    )


def _page_number(request: HttpRequest, name: str) -> int:
    """A queue's page asked for in the query string (1 when absent or not a number; the selector clamps it)."""
    value = request.GET.get(name, "")[:6]
    return int(value) if value.isdigit() else 1


@require_GET
@operator_required
def order_events(request: HttpRequest, public_id: str) -> HttpResponse:
    """The order's history before `?before=<event id>`, a page at a time (the order page shows the latest)."""
    order = get_object_or_404(Order, public_id=public_id)
    page = order_events_page(order=order, before=whole_number(request.GET.get("before")))
    return render(request, "console/order_events.html", {"order": order, "page": page})


@require_GET
@operator_required
def order_detail(request: HttpRequest, public_id: str) -> HttpResponse:
    order = get_object_or_404(Order.objects.select_related("hardware_class", "environment"), public_id=public_id)
    seen = f"{order.status}-{int(order.ends_at.timestamp())}"
    if request.htmx and request.GET.get("seen", seen) != seen:
        # The order moved on (status or window) since the page was drawn: the header and actions change too.
        return HttpResponseClientRefresh()
    runs = list(order.provisioning_runs.prefetch_related("steps__host")[:20])
    free_lots = []
    if order.status in booking_services.REASSIGNABLE:
        policy = BookingPolicy.current()
        window = order_window(order=order, policy=policy)
        free_ids = free_lot_ids(hardware_class=order.hardware_class, window=window, limit=50)
        free_lots = list(Lot.objects.filter(pk__in=free_ids).select_related("host"))
    elif order.status in booking_services.MOVABLE:  # a provider fault: lots free for the rest of the window
        free_ids = booking_services.free_lots_for_move(order=order)
        free_lots = list(Lot.objects.filter(pk__in=free_ids).select_related("host").order_by("host__name", "name"))
    context = {
        "order": order,
        "seen": seen,
        "runs": runs,
        "events_page": order_events_page(order=order),  # the latest; older ones on order_events' pages
        "accesses": list(order.accesses.select_related("host")),
        "allocations": list(order.allocations.select_related("lot__host")),
        "invoices": list(order.invoices.all()),
        "refunds": order_refunds(order),
        "free_lots": free_lots,
        "awaits_decision": rules.awaits_preflight_decision(order),
    }
    template = "console/order.html#runs" if request.htmx else "console/order.html"
    return render(request, template, context)


def _number(post, name: str) -> int:
    number = whole_number(post.get(name))
    if number is None:
        raise BookingError(_("%(field)s: a number is required.") % {"field": name})
    return number


def _optional_number(post, name: str) -> int | None:
    return _number(post, name) if post.get(name) else None


ACTIONS = {
    "approve": lambda order, user, reason, post: services.order_approve(order=order, actor=user),
    "reject": lambda order, user, reason, post: services.order_reject(order=order, actor=user, reason=reason),
    "retry": lambda order, user, reason, post: runs.provisioning_retry(
        order=order, actor=user, run_id=_optional_number(post, "run")
    ),
    "preflight": lambda order, user, reason, post: runs.preflight_rerun(order=order, actor=user),
    "restart": lambda order, user, reason, post: runs.container_restart(order=order, actor=user),
    "handover": lambda order, user, reason, post: runs.provisioning_hand_over(order=order, actor=user, reason=reason),
    "teardown": lambda order, user, reason, post: runs.teardown_start(
        order=order, actor=user, reason=reason or "torn down by an operator"
    ),
    "provision": lambda order, user, reason, post: runs.provisioning_start(order=order, actor=user),
    "reassign": lambda order, user, reason, post: moves.lot_reassign(
        order=order, from_lot_id=_number(post, "from_lot"), to_lot_id=_number(post, "to_lot"), actor=user
    ),
    "give_up_move": lambda order, user, reason, post: moves.move_give_up(
        order=order, run_id=_number(post, "run"), actor=user, reason=reason
    ),
    "move": lambda order, user, reason, post: moves.order_move(
        order=order,
        from_lot_id=_number(post, "from_lot"),
        to_lot_id=_number(post, "to_lot"),
        actor=user,
        hours_lost=_optional_number(post, "hours_lost") or 0,
        credit=post.get("credit", moves.Credit.NONE),
    ),
    "extend": lambda order, user, reason, post: checkout.order_extension_request(
        order=order, days=_number(post, "days"), actor=user
    ),
    "cancel": lambda order, user, reason, post: booking_services.order_cancel_by_operator(
        order=order, actor=user, reason=reason
    ),
}


ACTION_NAMES = {
    "approve": gettext_lazy("approval"),
    "reject": gettext_lazy("rejection"),
    "retry": gettext_lazy("retry"),
    "preflight": gettext_lazy("pre-flight re-run"),
    "restart": gettext_lazy("container start"),
    "handover": gettext_lazy("hand-over"),
    "teardown": gettext_lazy("teardown"),
    "provision": gettext_lazy("provisioning"),
    "reassign": gettext_lazy("reassignment"),
    "move": gettext_lazy("move (the customer is e-mailed)"),
    "give_up_move": gettext_lazy("decision on the failed move (not retried any more)"),
    "extend": gettext_lazy("extension request"),
    "cancel": gettext_lazy("cancellation"),
}


@require_POST
@operator_required
def order_action(request: HttpRequest, public_id: str, action: str) -> HttpResponse:
    order = get_object_or_404(Order, public_id=public_id)
    if action not in ACTIONS:
        raise PermissionDenied
    reason = request.POST.get("reason", "").strip()[:2000]
    try:
        ACTIONS[action](order, request.user, reason, request.POST)
    except BookingError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request, _("%(order)s: %(action)s done.") % {"order": order.public_id, "action": ACTION_NAMES[action]}
        )
    return redirect("console:order", public_id=order.public_id)


@require_POST
@operator_required
def refund_pay(request: HttpRequest, refund_id: int) -> HttpResponse:
    """The operator paid a refund from their wallet and enters the transaction's hash: the portal reads it on chain
    and counts what it paid to the refund address."""
    refund = get_object_or_404(Refund, pk=refund_id)
    try:
        outcome = refund_credit_tx(refund=refund, tx_hash=request.POST.get("tx_hash", "")[:200], user=request.user)
    except PaymentError as exc:
        messages.error(request, exc.message)
    except ChainUnavailable:
        messages.error(request, _("The network is not answering right now: nothing changed. Enter the hash again."))
    else:
        refund.refresh_from_db()
        text = str(REFUND_TX_MESSAGES[outcome])
        if outcome in (RefundTxOutcome.CREDITED, RefundTxOutcome.CONFIRMING):
            if refund.status == Refund.Status.PAID:
                text += " " + _("Refund %(order)s paid in full: the customer is e-mailed.") % {
                    "order": refund.order.public_id
                }
            elif outcome == RefundTxOutcome.CREDITED:
                text += " " + _("Still to pay: %(left)s %(asset)s.") % {
                    "left": format_units(refund.amount_left_units, refund.asset_decimals),
                    "asset": refund.asset_symbol,
                }
            messages.success(request, text)
        else:
            messages.error(request, text)
    return redirect(reverse("console:queue") + "#section-refunds")


@require_POST
@operator_required
def flagged_payment_action(request: HttpRequest, invoice_id: int, action: str) -> HttpResponse:
    """A payment that bought nothing, waiting in the queue: the operator refunds it, or applies it to its order
    when the order can still take it (payments/unapplied.py says which, and why not)."""
    invoice = get_object_or_404(Invoice.objects.select_related("order"), pk=invoice_id)
    order_id = invoice.order.public_id
    try:
        if action == "refund":
            refund = unapplied.invoice_refund_unapplied(invoice=invoice, actor=request.user)
            text = _("%(order)s: a refund of %(amount)s %(asset)s is opened; the customer is asked for an address.") % {
                "order": order_id,
                "amount": format_units(refund.amount_units, refund.asset_decimals),
                "asset": refund.asset_symbol,
            }
        elif action == "apply":
            unapplied.invoice_apply_to_order(invoice=invoice, actor=request.user)
            text = _("%(order)s: the payment is applied to the order.") % {"order": order_id}
        else:
            raise Http404
    except PaymentError as exc:
        messages.error(request, _("%(order)s: %(why)s") % {"order": order_id, "why": exc.message})
    else:
        messages.success(request, text)
    return redirect(reverse("console:queue") + "#section-flagged")


@require_GET
@operator_required
def calendar(request: HttpRequest) -> HttpResponse:
    """Lots × days over the coming weeks: held (unpaid), booked (paid and later), turnaround, maintenance."""
    start_day = timezone.now().astimezone(UTC).date()
    days = [start_day + timedelta(days=offset) for offset in range(28)]
    range_start = datetime.combine(days[0], time.min, tzinfo=UTC)
    range_end = datetime.combine(days[-1] + timedelta(days=1), time.min, tzinfo=UTC)
    lots = list(Lot.objects.select_related("hardware_class", "host").order_by("hardware_class__position", "name"))
    allocations = list(
        Allocation.objects.filter(released_at__isnull=True, starts_at__lt=range_end, ends_at__gt=range_start)
        .select_related("order")
        .only(
            "lot_id", "starts_at", "ends_at", "order__public_id", "order__status", "order__starts_at", "order__ends_at"
        )
    )
    by_lot: dict[int, list[Allocation]] = {}
    for allocation in allocations:
        by_lot.setdefault(allocation.lot_id, []).append(allocation)
    rows = []
    for lot in lots:
        cells = []
        for day in days:
            day_start = datetime.combine(day, time.min, tzinfo=UTC)
            day_end = day_start + timedelta(days=1)
            cell = {"state": "maintenance" if lot.status == Lot.Status.MAINTENANCE else "free", "order": None}
            for allocation in by_lot.get(lot.pk, []):
                if allocation.starts_at < day_end and allocation.ends_at > day_start:
                    order = allocation.order
                    in_window = order.starts_at < day_end and order.ends_at > day_start
                    held = order.status in (OrderStatus.AWAITING_PAYMENT, OrderStatus.PAYMENT_PROCESSING)
                    cell = {"state": ("held" if held else "booked") if in_window else "turnaround", "order": order}
                    if in_window and order.ends_at - day_end < timedelta(days=1) and not held:
                        cell["state"] = "ending"
            cells.append(cell)
        rows.append({"lot": lot, "cells": cells})
    return render(request, "console/calendar.html", {"days": days, "rows": rows})


# --- hosts ---------------------------------------------------------------------------------------------------


REPORT_WEEKS = 8
REPORT_MONTHS = 12


@require_GET
@operator_required
def reports(request: HttpRequest) -> HttpResponse:
    """Utilisation (lot-days sold / available per class and host, by week), revenue by month (the price of the time
    given less the price refunded), and the money held or owed back now, on a line of its own."""
    today = timezone.now().astimezone(UTC).date()
    first_week = today - timedelta(weeks=REPORT_WEEKS // 2)
    asked = request.GET.get("from", "").strip()[:10]
    if asked:
        try:
            first_week = date.fromisoformat(asked)
        except ValueError:
            messages.error(request, _("Give the first week as a date, e.g. 2026-03-02."))
    weeks, rows = utilisation_by_week(first_week=first_week, weeks=REPORT_WEEKS)
    month = today.replace(day=1)
    for _month in range(REPORT_MONTHS - 1):
        month = (month - timedelta(days=1)).replace(day=1)
    context = {
        "weeks": weeks,
        "rows": rows,
        "revenue": revenue_by_month(since=month),
        "held": money_held_or_owed(),
        "dust_threshold": dust_threshold(),
        "previous": weeks[0] - timedelta(weeks=REPORT_WEEKS),
        "next": weeks[0] + timedelta(weeks=REPORT_WEEKS),
    }
    return render(request, "console/reports.html", context)


@require_GET
@operator_required
def hosts(request: HttpRequest) -> HttpResponse:
    context = {
        "hosts": list(selectors.hosts_for_console().select_related("exclusive_lot")),
        "flagged_orders": list(selectors.orders_on_unisolated_hosts()),
    }
    return render(request, "console/hosts.html", context)


@require_GET
@operator_required
def host_detail(request: HttpRequest, name: str) -> HttpResponse:
    host = get_object_or_404(Host.objects.select_related("exclusive_lot"), name=name)
    check_in_flight = host.check_state in (Host.CheckState.QUEUED, Host.CheckState.RUNNING)
    if request.htmx:  # the check's block, polled while the check is queued or running
        if not check_in_flight:
            return HttpResponseClientRefresh()  # done: the whole page, with the finding and the report
        return render(request, "console/host.html#host-check", {"host": host, "check_in_flight": True})
    context = {
        "host": host,
        "check_in_flight": check_in_flight,
        "limits": selectors.container_limits(host),
        "lots": list(host.lots.select_related("hardware_class").order_by("name")),
        "booked_orders": list(selectors.orders_booked_on(host=host)[:100]),
        "maintenance_windows": list(host.maintenance_windows.filter(ends_at__gt=timezone.now())[:50]),
        "to_move": selectors.orders_to_move(host=host),
    }
    return render(request, "console/host.html", context)


@require_POST
@operator_required
def host_check(request: HttpRequest, name: str) -> HttpResponse:
    request_host_checks(request, [get_object_or_404(Host, name=name)])
    return redirect("console:host", name=name)
