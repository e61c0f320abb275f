"""The order page and everything a customer does on it, one view each: the routes under the order's link in
web/customer/urls.py are the list (the page and its polled status block, its events, payment, billing, invoices,
keys, extension, cancellation, refunds, readings, links, split-trial reports; "book again" is
web/customer/booking.py's). Parse, call one service or selector, render."""

from datetime import timedelta
from decimal import Decimal, InvalidOperation

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseStopPolling
from django_ratelimit.core import is_ratelimited

from booking import archcheck_report, links, selectors, services, split_trial_conclusion
from booking import split_trial_upload as split_trial_uploads
from booking.billing import BillingDetails, billing_details_of
from booking.cancellation import refund_quote
from booking.models import AlertMails, Order, OrderStatus, WindowDays
from booking.rules import BookingError
from infrastructure.numbers import whole_number
from payments import checkout, fiscal, fiscal_documents, invoices, refunds
from payments import selectors as payment_selectors
from payments.errors import PaymentError
from provisioning import research_record
from provisioning import selectors as provisioning_selectors
from provisioning import services as provisioning_services
from provisioning.models import OperatorSettings
from web import status_cache
from web.customer import addresses
from web.customer.forms import AlertMailsForm, BillingForm, CheckpointWatchForm, KeysAddForm


def order_behind_link(public_id: str, token: str) -> Order | None:
    """The order behind a secret link that still works, or None."""
    order = selectors.order_for_link(public_id=public_id, token=token)
    return None if order is None or _link_expired(order) else order


def _order_or_404(public_id: str, token: str) -> Order:
    order = order_behind_link(public_id, token)
    if order is None:
        raise Http404("No such order.")
    return order


def _link_expired(order: Order) -> bool:
    """An order's links live as long as the order and its data: they stop once it is settled and the files kept
    after its window are gone (the operators' grace period)."""
    now = timezone.now()
    if not order.is_settled or now <= order.ends_at:
        return False
    return now > order.ends_at + timedelta(days=OperatorSettings.current().wipe_after_days)


def mark_private(response: HttpResponse) -> HttpResponse:
    """The order page is a secret: never sent as a referrer to another site, never indexed (never_cache keeps it
    out of caches). `same-origin`, not `no-referrer`: under `no-referrer` Chromium posts this page's forms with
    `Origin: null`, which the CSRF check refuses; `same-origin` gives our own server the real origin (and the
    referrer, which its logs redact) and every other site nothing, not even our origin (docs/architecture.md)."""
    response["Referrer-Policy"] = "same-origin"
    response["X-Robots-Tag"] = "noindex, nofollow"
    return response


@require_http_methods(["GET"])
@never_cache
def order_detail(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """The order page, or its polled status block for htmx. A poll whose block is still current never gets
    here: web.poll answers it "unchanged"."""
    versions = status_cache.current_versions(public_id)  # before the order is read (web/status_cache.py)
    order = _order_or_404(public_id, token)
    links.link_opened(order=order, token=token)
    if getattr(order, "link_mailed", False):  # a link sent by e-mail: this browser reads that mailbox
        addresses.remember(request, order.contact_email)
    return order_page(request, order, token, versions=versions)


@require_http_methods(["GET"])
@never_cache
def order_events(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """The order's status changes before `?before=<event id>`, a page at a time (the order page shows the latest)."""
    order = _order_or_404(public_id, token)
    before = whole_number(request.GET.get("before"))
    page = selectors.order_events_page(order=order, before=before, transitions_only=True)
    return mark_private(render(request, "customer/order_events.html", {"order": order, "token": token, "page": page}))


END_WARNING = timedelta(hours=48)  # the order page warns this long before an active window ends


def _status_fresh_for(order: Order, *, now) -> float:
    """How long the status block's text stays true without a write: until the end warning appears, if due."""
    time_left = order.ends_at - now
    if order.status == OrderStatus.ACTIVE and time_left >= END_WARNING:
        return (time_left - END_WARNING).total_seconds()
    if order.can_be_cancelled_with_refund:  # the refund shown changes at the rules' deadlines
        until = refund_quote(order=order, now=now).valid_until
        if until is not None:
            return max(0.0, min(float(status_cache.RECORD_TTL), (until - now).total_seconds()))
    return float(status_cache.RECORD_TTL)


ACCESS_SHOWN = (OrderStatus.READY, OrderStatus.ACTIVE, OrderStatus.ENDED)
# Paid for and called off: the page says what is owed back, then that it went back.
REFUNDED_STATUSES = (OrderStatus.CANCELLED, OrderStatus.REJECTED)


def _order_context(order: Order, token: str) -> dict:
    split_trials = (
        list(order.split_trials.all()[:5])
        if order.status in (OrderStatus.READY, OrderStatus.ACTIVE, OrderStatus.ENDED)
        else []
    )
    now = timezone.now()
    accesses = order.accesses.select_related("host")
    if order.status in (OrderStatus.READY, OrderStatus.ACTIVE):  # not a host the order left (a lot reassigned)
        accesses = accesses.exclude(status="revoked")
    shown = list(accesses) if order.status in ACCESS_SHOWN else []
    volumes = [access for access in shown if access.disk_gib]
    return {
        "order": order,
        "token": token,
        # The latest status changes; older ones on their own pages (order_events).
        "events_page": selectors.order_events_page(order=order, transitions_only=True),
        "rejection": selectors.order_rejection(order),
        "ssh_keys": list(order.ssh_keys.all()),
        "keys_can_change": provisioning_selectors.keys_can_change(order),
        "split_trials": split_trials,
        "charts": selectors.split_trial_bars(split_trials[0].report) if split_trials else {},
        # What the archcheck report given at booking says of the order's cards.
        "archcheck": (
            archcheck_report.verdicts_for(order.archcheck_report, [order.hardware_class])
            if order.archcheck_report
            else []
        ),
        "accesses": shown,
        # The data volumes as made, once the machines are prepared; until then what the lots' hosts promise.
        "volumes": volumes,
        "disk": None if volumes else selectors.order_disk(order=order),
        "now": now,
        "end_warning": order.status == OrderStatus.ACTIVE and order.ends_at - now < END_WARNING,
        "progress": _provisioning_progress(order),
        # What a paid order waits for, as the operator set it (automatic or their response time, the lead).
        "approval": (
            provisioning_selectors.approval_outlook(order)
            if order.status in (OrderStatus.PAID, OrderStatus.APPROVED)
            else None
        ),
        "payment": payment_selectors.payment_view(order),  # the current invoice: address, amount, QR code
        "extension": _extension_payment(order),
        "refund": refund_quote(order=order, now=now) if order.can_be_cancelled_with_refund else None,
        "refunded": order.status in REFUNDED_STATUSES and payment_selectors.order_refunds_paid(order),
        # Data continuity: the volume this order can still hand to a next booking, where its data went, and whose
        # data this order carries.
        "kept_data": provisioning_selectors.kept_data_access(order),
        "data_carried_to": (
            selectors.order_data_carried(order=order)
            if order.status in provisioning_selectors.DATA_KEPT_STATUSES
            else None
        ),
    }


def _split_trials_explain(order: Order, split_trials: list) -> None:
    """Each report's conclusion, written in the page's language beside the hypothesis written at booking."""
    for trial in split_trials:
        trial.conclusion = split_trial_conclusion.split_trial_conclusion(
            report=trial.report, hypothesis=order.hypothesis, sharing=order.sharing
        )
        trial.runs = [
            dict(
                run,
                label=split_trial_conclusion.STRATEGY_LABELS[run["strategy"]],
                status_label=split_trial_conclusion.STATUS_LABELS[run["status"]],
            )
            for run in trial.report.get("runs", [])
        ]


def _extension_offers(order: Order) -> list[dict]:
    """What each extension would cost now, or why it cannot be had, for a ready or active window with no extension
    waiting for its payment."""
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE):
        return []
    if order.extension_held_until is not None and order.extension_held_until > timezone.now():
        return []
    offers = []
    for days in WindowDays.values:
        try:
            offers.append({"days": days, "price": services.extension_price(order=order, days=days)})
        except BookingError as exc:
            offers.append({"days": days, "price": None, "why": exc.message})
    left = services.days_to_next_booking(order=order)
    if left is not None:  # the cards are taken again sooner than some window on sale would end: up to then
        try:
            price = services.extension_price(order=order, days=left)
        except BookingError:
            pass
        else:
            offers.append({"days": left, "price": price, "until_next_booking": True})
    return offers


def _extension_payment(order: Order) -> payment_selectors.PaymentView | None:
    """The payment block of an extension being paid, on a ready or active window."""
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE):
        return None
    invoice = payment_selectors.open_extension_invoice(order)
    return payment_selectors.payment_view(order, invoice=invoice) if invoice is not None else None


def _provisioning_progress(order: Order) -> dict | None:
    """Step k of N of the run preparing the access, while it runs (provisioning's rows, read through the order); in
    a window, of the run moving the order to other lots after a provider fault, until it succeeds."""
    if order.status == OrderStatus.PROVISIONING:
        run = order.provisioning_runs.filter(kind="provision").first()
    elif order.status in (OrderStatus.READY, OrderStatus.ACTIVE):
        run = order.provisioning_runs.filter(kind="move").exclude(status="succeeded").first()
    else:
        run = None
    if run is None:
        return None
    statuses = list(run.steps.values_list("status", flat=True))
    done = statuses.count("done")
    return {"step": min(done + 1, len(statuses)), "steps": len(statuses), "moving": run.kind == "move"}


def order_page(request: HttpRequest, order: Order, token: str, *, versions: dict | None = None) -> HttpResponse:
    """The order page, or its live status block for htmx (also the answer to the payment actions' htmx posts).

    Either way the block names its rendering in its poll URL, and the rendering is remembered with the versions
    it was drawn at (web/status_cache.py): the very first poll of a page that is still current gets 204.
    `versions` must have been read before `order` was; without them the order is read again after them."""
    if versions is None:
        versions = status_cache.current_versions(order.public_id)
        order = _order_or_404(order.public_id, token)
    rendering_id = status_cache.new_token()
    context = {**_order_context(order, token), "poll_version": rendering_id}
    status_cache.remember_rendering(
        public_id=order.public_id,
        token=token,
        rendering_id=rendering_id,
        versions=versions,
        fresh_for=_status_fresh_for(order, now=context["now"]),
    )
    if request.htmx:
        response = render(request, "customer/order.html#order-status", context)
        if order.is_settled:
            response = HttpResponseStopPolling(response.content)
        return mark_private(response)
    # What sits outside the polled status block is drawn for the whole page only, never for a poll.
    _split_trials_explain(order, context["split_trials"])
    context["extension_offers"] = _extension_offers(order)
    context["refunds"] = payment_selectors.order_refunds(order)
    context["fiscal_invoices"] = fiscal.fiscal_invoices_of(order)
    if not context["fiscal_invoices"]:
        details = billing_details_of(order)
        context["billing_form"] = BillingForm(
            initial={
                "organisation": details.organisation,
                "billing_address": details.address,
                "billing_country": details.country,
                "vat_number": details.vat_number,
                "purchase_order": details.purchase_order,
            }
        )
    if order.status in ACCESS_SHOWN:
        context["readings"] = provisioning_selectors.readings_charts(order)
        context["watch_alerts"] = provisioning_selectors.order_watch_alerts(order)
        context["alert_mails_form"] = AlertMailsForm(initial={"alert_mails": order.alert_mails})
        context["research_record"] = provisioning_selectors.order_research_record(order)
        context["checkpoints"] = provisioning_selectors.order_checkpoint_state(order)  # an access, its last reading
    return mark_private(render(request, "customer/order.html", context))


@require_POST
@never_cache
def order_cancel(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    order = _order_or_404(public_id, token)
    try:
        services.order_cancel_by_customer(order=order, refund_shown=_amount(request.POST.get("refund_shown", "")))
    except BookingError as exc:
        messages.error(request, exc.message)
    else:
        order.refresh_from_db(fields=["refund_due", "currency"])
        if order.refund_due:
            messages.success(
                request,
                _(
                    "Your order is cancelled and its lots are released. %(amount)s %(currency)s are owed back to "
                    "you: give the address to refund to below."
                )
                % {"amount": order.refund_due, "currency": order.currency},
            )
        else:
            messages.success(request, _("Your order is cancelled and its lots are released."))
    return redirect("customer:order", public_id=order.public_id, token=token)


@require_POST
@never_cache
def order_refund_address(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """The customer gives (or changes) the address their refund is sent to."""
    order = _order_or_404(public_id, token)
    back = reverse("customer:order", kwargs={"public_id": public_id, "token": token}) + "#refunds"
    if is_ratelimited(
        request, group="refund-address", key=lambda _g, _r: public_id, rate="20/h", method="POST", increment=True
    ):
        messages.error(request, _("Too many address changes for this order: try again in an hour."))
        return redirect(back)
    refund_id = whole_number(request.POST.get("refund"))
    refund = order.refunds.filter(pk=refund_id).first() if refund_id is not None else None
    if refund is None:
        messages.error(request, _("This order has no such refund."))
        return redirect(back)
    try:
        refunds.refund_set_address(refund=refund, address=request.POST.get("address", "")[:200])
    except PaymentError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request, _("Refund address saved. The operators send the refund there; you get an e-mail once it is sent.")
        )
    return redirect(back)


@require_POST
@never_cache
def order_links_revoke(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """Revoke every link to the order (this one included) and mail a new one to the order's contact."""
    order = _order_or_404(public_id, token)
    links.order_links_revoke(order=order, token=token)
    context = {
        "order": order,
        "masked_email": _masked_email(order.contact_email),
        "language_next": reverse("customer:book"),
    }
    return mark_private(render(request, "customer/links_revoked.html", context))


def _amount(text: str) -> Decimal | None:
    """The refund the page showed, as posted back (anything else: None, and the customer is asked again)."""
    if len(text) > 20:
        return None
    try:
        amount = Decimal(text)
    except InvalidOperation:
        return None
    return amount if amount.is_finite() else None


def _masked_email(email: str) -> str:
    """Enough of the address for its owner to recognise it, not enough to learn it: a•••@example.org."""
    local, _at, domain = email.partition("@")
    return f"{local[:1]}•••@{domain}"


@require_POST
@never_cache
def split_trial_upload(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    order = _order_or_404(public_id, token)
    upload = request.FILES.get("report")
    if upload is None:
        messages.error(request, _("Choose the report file (report.json) written by the split-trial kit."))
    elif upload.size > 256_000:
        messages.error(request, str(split_trial_uploads.SPLIT_TRIAL_MESSAGES["too_large"]))
    else:
        try:
            split_trial_uploads.split_trial_upload(order=order, raw=upload.read(256_001))
        except BookingError as exc:
            messages.error(request, str(exc.message))
        else:
            messages.success(request, _("Split-trial report added to your order."))
    return redirect(reverse("customer:order", kwargs={"public_id": public_id, "token": token}) + "#split-trial")


@require_POST
@never_cache
def invoice_paid(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    order = _order_or_404(public_id, token)
    if is_ratelimited(request, group="i-paid", key="ip", rate="30/h", method="POST", increment=True):
        messages.error(request, _("You pressed “I've paid” many times: we keep checking the chain on our own."))
        return redirect("customer:order", public_id=public_id, token=token)
    tx_hint = request.POST.get("tx_hint", "")[:200]
    if tx_hint.strip() and is_ratelimited(
        request, group="tx-hint", key=lambda _g, _r: public_id, rate="10/h", method="POST", increment=True
    ):
        # Each hash is read on chain: a page (or a script) cannot make the portal read hashes without end.
        messages.error(
            request, _("You sent many transaction hashes for this order: try again in an hour. We keep checking.")
        )
        return redirect("customer:order", public_id=public_id, token=token)
    invoice_id = whole_number(request.POST.get("invoice"))
    invoice = (
        order.invoices.filter(pk=invoice_id).first()
        if invoice_id is not None
        else payment_selectors.current_invoice(order)
    )
    if invoice is None:
        messages.error(request, _("This order has no invoice to pay."))
    else:
        try:
            invoices.invoice_customer_paid(invoice=invoice, tx_hint=tx_hint)
        except PaymentError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(
                request, _("Thank you. We are looking for your transfer on chain; this page updates by itself.")
            )
    if request.htmx:
        return order_page(request, order, token)
    return redirect("customer:order", public_id=public_id, token=token)


@require_POST
@never_cache
def invoice_asset(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    order = _order_or_404(public_id, token)
    try:
        invoices.invoice_change_asset(order=order, asset_key=request.POST.get("asset", "")[:40])
    except PaymentError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, _("New payment instructions below: use these, not the previous ones."))
    return redirect("customer:order", public_id=public_id, token=token)


@require_POST
@never_cache
def order_extend(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """Ask for more days: the lots are held while the extension's invoice is open; its payment block appears in the
    status section and the window moves once it is paid."""
    order = _order_or_404(public_id, token)
    if is_ratelimited(
        request, group="extend", key=lambda _g, _r: public_id, rate="10/h", method="POST", increment=True
    ):
        messages.error(request, _("Too many extension requests for this order: try again in an hour."))
        return redirect("customer:order", public_id=public_id, token=token)
    try:
        checkout.order_extension_request(order=order, days=whole_number(request.POST.get("days")), actor=None)
    except (BookingError, PaymentError) as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, _("The lots are held for your extension: pay it below, and your window moves."))
    return redirect("customer:order", public_id=public_id, token=token)


@require_POST
@never_cache
def order_end_early(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """End the window now, once the customer confirmed they saved their results: teardown starts at once."""
    order = _order_or_404(public_id, token)
    if request.POST.get("confirm") != "end":
        messages.error(request, _("Tick the box to confirm that you saved your results, then end the window."))
        return redirect("customer:order", public_id=public_id, token=token)
    try:
        services.order_end_early(order=order)
    except BookingError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, _("Your window is ended: access is being revoked and the cards are free again."))
    return redirect("customer:order", public_id=public_id, token=token)


@require_POST
@never_cache
def order_keys(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """Add keys (the textarea) or remove one (its button): applied on the machines at once during the window, and
    e-mailed to the contact."""
    order = _order_or_404(public_id, token)
    back = reverse("customer:order", kwargs={"public_id": public_id, "token": token}) + "#keys"
    if is_ratelimited(request, group="keys", key=lambda _g, _r: public_id, rate="20/h", method="POST", increment=True):
        messages.error(request, _("Too many key changes for this order: try again in an hour."))
        return redirect(back)
    add, remove_ids = [], []
    if "remove" in request.POST:
        key_id = whole_number(request.POST.get("remove"))
        remove_ids = [key_id] if key_id is not None else []
    else:
        form = KeysAddForm(request.POST)
        if not form.is_valid():
            for error in form.errors.get("ssh_keys", []):
                messages.error(request, error)
            return redirect(back)
        add = form.cleaned_data["ssh_keys"]
    try:
        run = provisioning_services.access_keys_change(order=order, add=add, remove_ids=remove_ids)
    except BookingError as exc:
        messages.error(request, exc.message)
    else:
        if run is not None and remove_ids:
            messages.success(
                request,
                _(
                    "Key removed: within a minute your machines refuse it and every session open there (shells, "
                    "forwards, SFTP) is closed. Log in again with the keys you keep."
                ),
            )
        elif run is not None:
            messages.success(request, _("Keys changed: your machines get them within a minute."))
        else:
            messages.success(request, _("Keys saved."))
    return redirect(back)


@require_http_methods(["GET", "HEAD"])
@never_cache
def order_readings_csv(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """Every minute of the order's GPU readings, as CSV (UTC times; empty fields where the tool had no figure)."""
    order = _order_or_404(public_id, token)

    def rows():
        yield "taken_at_utc,host,gpu,utilization_pct,memory_used_mib,memory_total_mib,power_w,temperature_c\r\n"
        for host, taken_at, gpus in provisioning_selectors.order_readings(order):
            for sample in gpus:
                figures = ",".join("" if value is None else f"{value:g}" for value in sample)
                yield f"{taken_at:%Y-%m-%dT%H:%M:%SZ},{host},{figures}\r\n"

    response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="binome-{order.public_id}-gpu-readings.csv"'
    return mark_private(response)


RECORD_FILES = {  # the record's files, by the address's last part: (file name suffix, MIME type, field)
    "pdf": (".pdf", "application/pdf", "pdf"),
    "json": (".json", "application/json", "document"),
    "sig": (".json.sig", "application/octet-stream", "signature"),
}


@require_http_methods(["GET", "HEAD"])
@never_cache
def order_record(request: HttpRequest, public_id: str, token: str, kind: str) -> HttpResponse:
    """The research record's PDF, its signed JSON or the signature, exactly as kept."""
    order = _order_or_404(public_id, token)
    record = provisioning_selectors.order_research_record(order)
    if record is None or kind not in RECORD_FILES:
        raise Http404("No such record.")
    suffix, content_type, field = RECORD_FILES[kind]
    response = HttpResponse(bytes(getattr(record, field)), content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="binome-{order.public_id}-record{suffix}"'
    return mark_private(response)


@require_http_methods(["GET", "HEAD"])
def record_signing_key(request: HttpRequest) -> HttpResponse:
    """The public key that checks every research record this portal signs (PEM), for anyone."""
    response = HttpResponse(research_record.public_key_pem(), content_type="application/x-pem-file")
    response["Content-Disposition"] = 'inline; filename="binome-record-key.pem"'
    response["Cache-Control"] = "public, max-age=3600"
    return response


@require_POST
@never_cache
def order_checkpoints(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """Where the order's checkpoints are written, and how often: watched from the next look on."""
    order = _order_or_404(public_id, token)
    back = reverse("customer:order", kwargs={"public_id": public_id, "token": token}) + "#checkpoints"
    # each change is read at the next sweep, in the customer's container: not more often than this
    if is_ratelimited(
        request, group="checkpoints", key=lambda _g, _r: public_id, rate="10/h", method="POST", increment=True
    ):
        messages.error(request, _("Too many changes of the checkpoint watch: try again in an hour."))
        return redirect(back)
    form = CheckpointWatchForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            for error in errors:
                messages.error(request, error)
        return redirect(back)
    try:
        changed = services.order_checkpoint_watch_set(
            order=order,
            directory=form.cleaned_data["checkpoint_dir"],
            interval_hours=form.cleaned_data["checkpoint_interval_hours"],
        )
    except BookingError as exc:
        messages.error(request, exc.message)
        return redirect(back)
    if changed:  # the service set the order's fields
        messages.success(
            request,
            _("Saved: ~/%(directory)s is watched every %(hours)d hours.")
            % {"directory": order.checkpoint_dir, "hours": order.checkpoint_watch_interval_hours}
            if order.checkpoint_dir
            else _("The checkpoint watch is off."),
        )
    return redirect(back)


@require_POST
@never_cache
def order_alert_mails(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """How often the researcher is e-mailed about unbalanced or idle cards ("never" is one click)."""
    order = _order_or_404(public_id, token)
    back = reverse("customer:order", kwargs={"public_id": public_id, "token": token}) + "#readings"
    form = AlertMailsForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Choose how often these e-mails may come."))
        return redirect(back)
    choice = form.cleaned_data["alert_mails"]
    if services.order_alert_mails_set(order=order, value=choice):
        messages.success(
            request,
            _("No more e-mails about your cards' readings: the page still shows them.")
            if choice == AlertMails.OFF
            else _("Saved: the e-mails about your cards come %(how)s.") % {"how": AlertMails(choice).label},
        )
    return redirect(back)


@require_POST
@never_cache
def order_billing(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """Change who the invoice is made out to; refused once it is issued."""
    order = _order_or_404(public_id, token)
    back = reverse("customer:order", kwargs={"public_id": public_id, "token": token}) + "#billing"
    if is_ratelimited(
        request, group="billing", key=lambda _g, _r: public_id, rate="20/h", method="POST", increment=True
    ):
        messages.error(request, _("Too many changes of the billing details: try again in an hour."))
        return redirect(back)
    form = BillingForm(request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            label = form.fields[field].label if field in form.fields else ""
            for error in errors:
                messages.error(request, f"{label}: {error}" if label else error)
        return redirect(back)
    data = form.cleaned_data
    details = BillingDetails(
        organisation=data["organisation"],
        address=data["billing_address"],
        country=data["billing_country"],
        vat_number=data["vat_number"],
        purchase_order=data["purchase_order"],
    )
    try:
        changed = fiscal.order_billing_change(order=order, details=details)
    except BookingError as exc:
        label = form.fields[exc.field].label if exc.field in form.fields else ""
        messages.error(request, f"{label}: {exc.message}" if label else exc.message)
    else:
        messages.success(request, _("Billing details saved.") if changed else _("The billing details are unchanged."))
    return redirect(back)


@require_http_methods(["GET", "HEAD"])
@never_cache
def order_invoice_pdf(request: HttpRequest, public_id: str, token: str, number: str) -> HttpResponse:
    """An issued invoice of the order, as the PDF/A-3 kept since it was issued (printed now if the worker has not
    yet: printing is done once, whoever comes first)."""
    order = _order_or_404(public_id, token)
    fiscal_invoice = fiscal.fiscal_invoice_of(order=order, number=number)
    if fiscal_invoice is None:
        raise Http404("No such invoice.")
    try:
        fiscal_invoice = fiscal_documents.fiscal_invoice_write_document(fiscal_invoice=fiscal_invoice)
    except fiscal_documents.DocumentNotPrintable:
        context = {"order": order, "token": token, "fiscal_invoice": fiscal_invoice}
        return mark_private(render(request, "customer/invoice_not_printable.html", context))
    except OSError:  # the disk or a font file, for a moment: the worker prints it again by itself
        context = {"order": order, "token": token, "fiscal_invoice": fiscal_invoice, "try_again": True}
        return mark_private(render(request, "customer/invoice_not_printable.html", context, status=503))
    response = HttpResponse(bytes(fiscal_invoice.pdf), content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="{fiscal_invoice.filename}"'
    response["ETag"] = f'"{fiscal_invoice.pdf_sha256}"'
    return mark_private(response)
