"""Customer pages: parse, call one service or selector, render. Every page works without JavaScript; htmx only
swaps the live regions (`#quote` on the booking page, `#order-status` on the order page)."""

import hashlib
import logging
from datetime import timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.db import InterfaceError, OperationalError, connection
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import get_language, gettext_lazy
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseStopPolling
from django_ratelimit.core import is_ratelimited

from booking import advisor, page_cache, selectors, services, status_cache
from booking.forms import BookingForm, Catalog, FitForm, QuoteForm, ResendLinkForm, quote_initial
from booking.models import BookingPolicy, Order, OrderStatus
from booking.page_cache import PLACEHOLDER_MARK, cached_page
from booking.quotes import Quote, build_quote
from booking.rules import BookingError, SoldOut
from nodekit.bundle import script_bytes
from payments.selectors import PaymentView, open_extension_invoice, payment_view

logger = logging.getLogger(__name__)

BOOKING_INTERRUPTED = gettext_lazy(
    "We could not save your booking: our database stopped answering for a moment. Nothing was booked and nothing "
    "is owed. Your answers are kept below; press the button again to place the order."
)


def _quote_for(quote_form: QuoteForm | None, *, catalog: Catalog, policy: BookingPolicy, initial: dict) -> Quote | None:
    """The quote for the valid choices of `quote_form`, the defaults standing in for the others."""
    choice = dict(initial)
    if quote_form is not None:
        quote_form.is_valid()  # invalid choices keep their defaults; the quote form shows no errors
        choice.update(quote_form.cleaned_data)
    hardware_class = choice["hardware_class"]
    environment = choice["environment"]
    if isinstance(hardware_class, str):
        hardware_class = catalog.class_by_slug.get(hardware_class)
    if isinstance(environment, str):
        environment = catalog.environment_by_slug.get(environment)
    if hardware_class is None:
        return None
    return build_quote(
        classes=catalog.classes,
        hardware_class=hardware_class,
        environment=environment,
        lot_count=choice["lots"],
        start_date=choice["start_date"],
        days=choice["days"],
        policy=policy,
    )


_QUOTE_PARAMETERS = frozenset(QuoteForm.base_fields)


def _shared_query(request: HttpRequest) -> list[tuple[str, str]] | None:
    """The quote parameters an anonymous GET of the booking page is drawn from, in a fixed order (the last value
    of each, as the form reads them), or None when the page is not to be shared: pending flash messages,
    parameters other than the quote's, oversized values, or text that could pass for a cache placeholder."""
    if len(messages.get_messages(request)):
        return None
    values = request.GET.values()
    if not set(request.GET) <= _QUOTE_PARAMETERS or any(len(v) > 64 or PLACEHOLDER_MARK in v for v in values):
        return None
    return [(name, request.GET[name]) for name in sorted(request.GET)]


@require_http_methods(["GET", "POST"])
def book(request: HttpRequest) -> HttpResponse:
    """The booking page. GET (with or without choices) and POST action=quote only refresh the quote; a POST
    without it places the order. Anonymous GETs come from the shared page cache (booking/page_cache.py)."""
    if request.method == "GET" and (query := _shared_query(request)) is not None:
        canonical = urlencode(query)
        digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        # The language switch returns to the page drawn, not to whatever address the first visitor typed.
        shared = {"language_next": request.path + (f"?{canonical}" if canonical else "")}
        return cached_page(
            request,
            key=f"{'quote' if request.htmx else 'page'}:{digest}",
            render=lambda extra_context: _book(request, {**extra_context, **shared}),
        )
    return _book(request)


def _catalog_and_policy() -> tuple[Catalog, BookingPolicy]:
    """The classes on offer and the booking rules, from the shared cache until the catalog changes."""
    return page_cache.remember(
        "booking:catalog", lambda: (Catalog(classes=list(selectors.offered_classes())), BookingPolicy.current())
    )


def _book(request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
    catalog, policy = _catalog_and_policy()
    earliest = selectors.earliest_start_date(policy=policy)
    latest = selectors.latest_start_date(policy=policy)
    initial = quote_initial(catalog=catalog, earliest=earliest)
    form_kwargs = {
        "catalog": catalog,
        "max_lots": policy.max_lots_per_order,
        "min_max": {"min": earliest.isoformat(), "max": latest.isoformat()},
    }
    placing = request.method == "POST" and request.POST.get("action") != "quote"
    status = 200

    if placing:
        if is_ratelimited(
            request, group="booking", key="ip", rate=settings.RATELIMIT_BOOKING, method="POST", increment=True
        ):
            return render(request, "429.html", status=429)
        form = BookingForm(request.POST, **form_kwargs)
        fit_form: FitForm | None = (
            FitForm(request.POST, prefix="fit") if request.POST.get("fit-parameters_billion") else None
        )
        if form.is_valid():
            hypothesis = form.cleaned_data["hypothesis"]
            fit_advice = _fit_advice(fit_form, hypothesis=hypothesis, catalog=catalog) if fit_form else None
            fit = {"fit_inputs": fit_form.stored_inputs(), "fit_advice": fit_advice} if fit_advice else {}
            try:
                order, token = services.order_create(
                    request=_booking_request(form, language=get_language(), **fit), policy=policy
                )
            except SoldOut as exc:
                return _sold_out_page(request, form, exc)
            except BookingError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            except (OperationalError, InterfaceError) as exc:
                # The database went away mid-booking: the transaction is gone with it (nothing was booked). The
                # next query opens a new connection; the page is drawn again with everything the researcher typed.
                logger.warning("booking interrupted by the database: %s", exc)
                connection.close()
                form.add_error(None, BOOKING_INTERRUPTED)
                status = 503
            else:
                messages.success(
                    request, _("Your lots are held. Keep this page's address: it is the key to your order.")
                )
                return redirect("booking:order", public_id=order.public_id, token=token)
        quote_form: QuoteForm | None = QuoteForm(request.POST, **form_kwargs)  # the form comes back: requote
    else:
        source = request.POST if request.method == "POST" else request.GET
        quote_form = QuoteForm(source, **form_kwargs) if source.get("hardware_class") else None
        typed = {name: source.get(name) for name in BookingForm.base_fields if source.get(name) is not None}
        form = BookingForm(initial={**initial, **typed}, **form_kwargs)
        fit_form = FitForm(prefix="fit")

    quote = _quote_for(quote_form, catalog=catalog, policy=policy, initial=initial)
    context = {
        "form": form,
        "fit_form": fit_form or FitForm(prefix="fit"),
        "quote": quote,
        "catalog": catalog,
        "policy": policy,
        **(extra_context or {}),
    }
    if request.htmx and request.method == "GET":
        return render(request, "booking/book.html#quote", context)
    return render(request, "booking/book.html", context, status=status)


KEPT_PLACEHOLDER = f"{PLACEHOLDER_MARK}kept_answers__"


def _sold_out_page(request: HttpRequest, form: BookingForm, sold_out: SoldOut) -> HttpResponse:
    """A short answer: what happened, the next dates as one-click bookings with the same answers, and the way
    back to the form with everything kept.

    A rush on the last lot gets 99 of these at once, all alike but for the answers kept and the CSRF token: the
    page is drawn once per language, request and answer (message and next dates) and kept in the shared page
    cache until availability changes, with placeholders for those two, replaced per response."""
    fields = [*BookingForm.base_fields, *(f"fit-{name}" for name in FitForm.base_fields)]
    kept = format_html_join(
        "",
        '<input type="hidden" name="{}" value="{}">',
        ((name, value) for name in fields if name != "start_date" for value in request.POST.getlist(name)),
    )
    data = form.cleaned_data
    drawn_for = (get_language(), data["hardware_class"].pk, data["start_date"], data["days"], data["lots"])
    answer = (str(sold_out.message), tuple(sold_out.next_dates))
    key = "booking:sold-out:" + hashlib.sha256(repr((drawn_for, answer)).encode()).hexdigest()

    def draw() -> bytes:
        context = {
            "message": sold_out.message,
            "next_dates": sold_out.next_dates,
            "kept": mark_safe(KEPT_PLACEHOLDER),  # noqa: S308 (a constant)
            "start_date": data["start_date"],
            "days": data["days"],
            "lot_count": data["lots"],
            "hardware_class": data["hardware_class"],
            # Nothing of this visitor in a shared page: their messages wait for their next page, and the language
            # switch goes back to the booking page rather than to the address they posted to.
            "messages": (),
            "language_next": reverse("booking:book"),
            **page_cache.SHARED_CONTEXT,
        }
        return render(request, "booking/sold_out.html", context).content

    body = page_cache.remember(key, draw)
    body = page_cache.for_visitor(request, body)
    return HttpResponse(body.replace(KEPT_PLACEHOLDER.encode(), str(kept).encode()))  # what they typed: last


def _booking_request(form: BookingForm, *, language: str, **fit) -> services.BookingRequest:
    data = form.cleaned_data
    return services.BookingRequest(
        **fit,
        hardware_class=data["hardware_class"],
        environment=data["environment"],
        lot_count=data["lots"],
        start_date=data["start_date"],
        days=data["days"],
        contact=services.Contact(
            name=data["contact_name"].strip(),
            email=data["contact_email"].strip(),
            organisation=data["organisation"].strip(),
            messenger=data["messenger"].strip(),
        ),
        ssh_keys=data["ssh_keys"],
        hypothesis=data["hypothesis"],
        hypothesis_detail=data["hypothesis_detail"].strip(),
        notes=data["notes"].strip(),
        language=language if language in dict(settings.LANGUAGES) else settings.LANGUAGE_CODE,
    )


def _order_or_404(public_id: str, token: str) -> Order:
    order = selectors.order_for_link(public_id=public_id, token=token)
    if order is None:
        raise Http404("No such order.")
    return order


def _extension_payment(order: Order) -> PaymentView | None:
    """The payment block of an extension being paid, on a ready or active window."""
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE):
        return None
    invoice = open_extension_invoice(order)
    return payment_view(order, invoice=invoice) if invoice is not None else None


def mark_private(response: HttpResponse) -> HttpResponse:
    """The order page is a secret: never sent as a referrer, never indexed (never_cache keeps it out of caches)."""
    response["Referrer-Policy"] = "no-referrer"
    response["X-Robots-Tag"] = "noindex, nofollow"
    return response


@require_http_methods(["GET"])
@never_cache
def order_detail(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    if request.htmx:
        return mark_private(_order_status(request, public_id, token))
    return order_page(request, _order_or_404(public_id, token), token)


def _order_status(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """The polled status block, from the shared cache while nothing it shows has changed (booking/status_cache.py).
    An entry exists only for a link the database accepted; a miss checks the link again."""
    key = status_cache.entry_key(public_id=public_id, token=token, language=request.LANGUAGE_CODE)
    entry = status_cache.lookup(key, public_id=public_id)
    if entry is None:
        order = _order_or_404(public_id, token)  # the link first: versions are only kept for real orders
        versions = status_cache.current_versions(order.public_id)
        # Then the order again: a write committed since the first read bumped the version read just now, and
        # the block must not be stored at that version while showing the order as it was before.
        order.refresh_from_db()
        rendering_id = status_cache.new_token()
        context = {**_order_context(order, token), "poll_version": rendering_id}
        response = render(request, "booking/order.html#order-status", {**context, **page_cache.SHARED_CONTEXT})
        entry = status_cache.Entry(versions, response.content, order.is_settled)
        status_cache.store(
            key,
            entry,
            public_id=public_id,
            token=token,
            rendering_id=rendering_id,
            fresh_for=_status_fresh_for(order, now=context["now"]),
        )
    body = page_cache.for_visitor(request, entry.body)
    return HttpResponseStopPolling(body) if entry.stop_polling else HttpResponse(body)


END_WARNING = timedelta(hours=48)  # the order page warns this long before an active window ends


def _status_fresh_for(order: Order, *, now) -> float:
    """How long the status block's text stays true without a write: until the end warning appears, if due."""
    time_left = order.ends_at - now
    if order.status == OrderStatus.ACTIVE and time_left >= END_WARNING:
        return (time_left - END_WARNING).total_seconds()
    return float(status_cache.ENTRY_TTL)


def _order_context(order: Order, token: str) -> dict:
    split_trials = (
        list(order.split_trials.all()[:5])
        if order.status in (OrderStatus.READY, OrderStatus.ACTIVE, OrderStatus.ENDED)
        else []
    )
    now = timezone.now()
    return {
        "order": order,
        "token": token,
        "events": list(order.events.all()),
        "ssh_keys": list(order.ssh_keys.all()),
        "payment": payment_view(order),
        "extension": _extension_payment(order),
        "split_trials": split_trials,
        "charts": selectors.split_trial_bars(split_trials[0].report) if split_trials else {},
        "accesses": list(order.accesses.select_related("host"))
        if order.status in (OrderStatus.READY, OrderStatus.ACTIVE, OrderStatus.ENDED)
        else [],
        "now": now,
        "end_warning": order.status == OrderStatus.ACTIVE and order.ends_at - now < END_WARNING,
    }


def order_page(request: HttpRequest, order: Order, token: str) -> HttpResponse:
    """The order page, or its live status block for htmx (also the answer to the payment actions' htmx posts)."""
    context = _order_context(order, token)
    if request.htmx:
        response = render(request, "booking/order.html#order-status", context)
        if order.is_settled:
            response = HttpResponseStopPolling(response.content)
        return mark_private(response)
    return mark_private(render(request, "booking/order.html", context))


@require_POST
@never_cache
def order_cancel(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    order = _order_or_404(public_id, token)
    try:
        services.order_cancel_by_customer(order=order)
    except BookingError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, _("Your order is cancelled and its lots are released."))
    return redirect("booking:order", public_id=order.public_id, token=token)


@require_http_methods(["GET", "POST"])
def resend_link(request: HttpRequest) -> HttpResponse:
    form = ResendLinkForm(request.POST or None)
    sent = False
    if request.method == "POST" and form.is_valid():
        email = form.cleaned_data["email"].strip().lower()
        limited = is_ratelimited(
            request, group="resend-link-ip", key="ip", rate=settings.RATELIMIT_RESEND_LINK, increment=True
        ) | is_ratelimited(
            request,
            group="resend-link-email",
            key=lambda group, request: email,
            rate=settings.RATELIMIT_RESEND_LINK,
            increment=True,
        )
        if limited:
            return render(request, "429.html", status=429)
        services.orders_request_links(email=email, language=get_language())
        sent = True
    return render(request, "booking/resend_link.html", {"form": form, "sent": sent})


@require_http_methods(["GET"])
def guide(request: HttpRequest) -> HttpResponse:
    """The researcher's guide, written per language (long-form text reads better than translated fragments)."""
    language = request.LANGUAGE_CODE if request.LANGUAGE_CODE in dict(settings.LANGUAGES) else "en"
    return render(request, f"booking/guide_{language}.html")


@require_http_methods(["GET"])
def fit_advisor(request: HttpRequest) -> HttpResponse:
    """The memory-fit advisor: its own page, and the live partial of the booking page (htmx)."""
    form = FitForm(request.GET if request.GET.get("fit-parameters_billion") else None, prefix="fit")
    catalog, _policy = _catalog_and_policy()
    advice = _fit_advice(form, hypothesis=request.GET.get("hypothesis", "")[:40], catalog=catalog)
    context = {"fit_form": form, "advice": advice}
    if request.htmx:
        return render(request, "booking/fit.html#advice", context)
    return render(request, "booking/fit.html", context)


def _fit_advice(form: FitForm, *, hypothesis: str, catalog: Catalog) -> dict | None:
    if not form.is_bound or not form.is_valid():
        return None
    inputs = form.fit_input()
    if inputs is None:
        return None
    return advisor.advise(inputs=inputs, classes=catalog.classes, hypothesis=hypothesis)


@require_POST
@never_cache
def split_trial_upload(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    order = _order_or_404(public_id, token)
    upload = request.FILES.get("report")
    if upload is None:
        messages.error(request, _("Choose the report file (report.json) written by the split-trial kit."))
    elif upload.size > 256_000:
        messages.error(request, str(services.SPLIT_TRIAL_MESSAGES["too_large"]))
    else:
        try:
            services.split_trial_upload(order=order, raw=upload.read(256_001))
        except BookingError as exc:
            messages.error(request, str(exc.message))
        else:
            messages.success(request, _("Split-trial report added to your order."))
    return redirect(reverse("booking:order", kwargs={"public_id": public_id, "token": token}) + "#split-trial")


@require_http_methods(["GET"])
def split_trial_kit(request: HttpRequest) -> HttpResponse:
    """The split-trial kit as one file (nodekit.bundle), also copied to each machine's ~/.binome/ at provisioning."""
    response = HttpResponse(script_bytes("split_trial"), content_type="text/x-python; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="split_trial.py"'
    return response
