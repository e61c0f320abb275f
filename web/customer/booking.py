"""The pages before an order's own: the booking page (and "book again" from an order), the memory-fit advisor, the
guide, the split-trial kit, "resend my link" and the address confirmation; web/customer/urls.py lists their routes.
Parse, call one service or selector, render. Every page works without JavaScript; htmx only swaps the live regions
(`#quote` on the booking page, `#fit` for the advisor)."""

import hashlib
import logging
from dataclasses import dataclass
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import InterfaceError, OperationalError, connection
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html_join
from django.utils.translation import get_language, gettext_lazy
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods
from django_ratelimit.core import is_ratelimited

from booking import advisor, archcheck_report, availability, links, placing, selectors
from booking.billing import BillingDetails
from booking.models import BookingPolicy, TermsVersion
from booking.quotes import Quote, build_quote
from booking.rules import BookingError, ConfirmAddressFirst, SoldOut, StaleTerms
from booking.terms import terms_current
from infrastructure import client
from nodekit.bundle import script_bytes
from payments import checkout
from provisioning import selectors as provisioning_selectors
from web.customer import addresses
from web.customer.forms import (
    BookingForm,
    CalendarForm,
    Catalog,
    ConfirmAddressForm,
    FitForm,
    QuoteForm,
    ResendLinkForm,
    archcheck_from_upload,
    quote_initial,
)
from web.customer.order import mark_private, order_behind_link
from web.page_cache import PLACEHOLDER_MARK, cached_page

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
        start_date=choice["start_date"] or initial["start_date"],
        start_when_ready=bool(choice.get("start_when_ready")),
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
    without it places the order with its invoice (payments/checkout.py). Anonymous GETs come from the shared page
    cache (web/page_cache.py)."""
    if request.method == "GET" and (query := _shared_query(request)) is not None:
        canonical = urlencode(query)
        digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        # The language switch returns to the page drawn, not to whatever address the first visitor typed.
        shared = {"language_next": request.path + (f"?{canonical}" if canonical else "")}
        return cached_page(
            request,
            key=f"{'quote' if request.htmx else 'page'}:{digest}",
            render=lambda extra_context: _booking_page(request, {**extra_context, **shared}),
        )
    if request.method == "POST" and request.POST.get("action") != "quote":
        return _place(request)
    return _booking_page(request)


def _catalog_and_policy() -> tuple[Catalog, BookingPolicy]:
    """The classes on offer and the booking rules (model instances), kept in memory until the catalog changes."""
    return availability.remember_in_process(
        "booking:catalog", lambda: (Catalog(classes=list(selectors.offered_classes())), BookingPolicy.current())
    )


@dataclass(frozen=True)
class _Desk:
    """What every drawing of the booking page starts from."""

    catalog: Catalog
    policy: BookingPolicy
    initial: dict
    form_kwargs: dict
    terms: TermsVersion | None


def _desk() -> _Desk:
    catalog, policy = _catalog_and_policy()
    earliest = selectors.earliest_start_date(policy=policy)
    latest = selectors.latest_start_date(policy=policy)
    terms = terms_current()
    return _Desk(
        catalog=catalog,
        policy=policy,
        terms=terms,
        initial={**quote_initial(catalog=catalog, earliest=earliest), "terms_version": terms.pk if terms else None},
        form_kwargs={
            "catalog": catalog,
            "max_lots": policy.max_lots_per_order,
            "min_max": {"min": earliest.isoformat(), "max": latest.isoformat()},
        },
    )


def _booking_page(request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
    """The page (or its quote, for htmx) with the choices of the query or the quote POST filled in."""
    desk = _desk()
    source = request.POST if request.method == "POST" else request.GET
    quote_form = QuoteForm(source, **desk.form_kwargs) if source.get("hardware_class") else None
    typed = {
        name: source.get(name)
        for name in BookingForm.base_fields
        if source.get(name) is not None and name not in ("terms_version", "accept_terms")
    }
    form = BookingForm(initial={**desk.initial, **typed}, **desk.form_kwargs)
    return _draw(request, desk, form=form, fit_form=None, quote_form=quote_form, extra_context=extra_context)


def _place(request: HttpRequest) -> HttpResponse:
    """Place the order and go to its page; or the sold-out answer; or the form again, everything typed kept.
    Only a booking that passed the form counts against the client's rate limit: junk costs us nothing to refuse,
    and counting it would let anyone use up the limit of everyone behind the same address."""
    desk = _desk()
    form = BookingForm(request.POST, request.FILES, **desk.form_kwargs)
    fit_form = FitForm(request.POST, prefix="fit") if request.POST.get("fit-parameters_billion") else None
    status, extra_context = 200, {}
    if form.is_valid():
        if is_ratelimited(
            request, group="booking", key="ip", rate=settings.RATELIMIT_BOOKING, method="POST", increment=True
        ):
            return render(request, "429.html", status=429)
        hypothesis = form.cleaned_data["hypothesis"]
        fit_advice = _fit_advice(fit_form, hypothesis=hypothesis, catalog=desk.catalog) if fit_form else None
        fit = {"fit_inputs": fit_form.stored_inputs(), "fit_advice": fit_advice} if fit_advice else {}
        email = form.cleaned_data["contact_email"]
        try:
            booking_request = _booking_request(
                form,
                language=get_language(),
                client_key=client.client_key(request),
                carry=_data_carry(form),
                contact_confirmed=addresses.confirmed(request, email),
                **fit,
            )
            order, token = checkout.order_place(request=booking_request, policy=desk.policy)
        except SoldOut as exc:
            return _sold_out_page(request, form, exc)
        except ConfirmAddressFirst as exc:
            form.add_error("contact_email", exc.message)
            extra_context["confirm_address"] = email
        except StaleTerms as exc:
            form.add_error("accept_terms", exc.message)
            _ask_again_for_terms(form, terms=terms_current())
        except BookingError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        except (OperationalError, InterfaceError) as exc:
            # The database went away mid-booking: the transaction is gone with it (nothing was booked). The next
            # query opens a new connection; the page is drawn again with everything the researcher typed.
            logger.warning("booking interrupted by the database: %s", exc)
            connection.close()
            form.add_error(None, BOOKING_INTERRUPTED)
            status = 503
        else:
            messages.success(request, _("Your lots are held. Keep this page's address: it is the key to your order."))
            return redirect("customer:order", public_id=order.public_id, token=token)
    quote_form = QuoteForm(request.POST, **desk.form_kwargs)  # the form comes back: requote
    return _draw(
        request, desk, form=form, fit_form=fit_form, quote_form=quote_form, status=status, extra_context=extra_context
    )


def _data_carry(form: BookingForm) -> placing.DataCarry | None:
    """The earlier order whose data the customer asked to carry, proven by its link's token, and the host keeping
    its volume; None when they did not ask. Raises BookingError (on the box) when it cannot be carried."""
    data = form.cleaned_data
    if not data["carry_data"] or not data["carry_from"]:
        return None
    earlier = order_behind_link(data["carry_from"], data["carry_token"])
    if earlier is None:
        raise BookingError(
            _("The link of the order whose data you want to carry no longer works. Untick the box to book anyway."),
            field="carry_data",
        )
    kept = provisioning_selectors.kept_data_access(earlier)
    if kept is None:
        raise BookingError(
            _(
                "The data of order %(number)s can no longer be carried: it was deleted, carried to another order, "
                "or is spread over several machines. Untick the box to book with an empty disk."
            )
            % {"number": earlier.public_id},
            field="carry_data",
        )
    return placing.DataCarry(order=earlier, host_id=kept.host_id, kept_until=provisioning_selectors.wipe_date(earlier))


@require_http_methods(["GET"])
@never_cache
def book_again(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    """The booking page opened from an order's link, to book again with its data: the order's choices, contact and
    keys filled in, and the box that carries its data volume to the new order (on the same machine)."""
    earlier = order_behind_link(public_id, token)
    if earlier is None:
        raise Http404("No such order.")
    kept = provisioning_selectors.kept_data_access(earlier)
    desk = _desk()
    choices = {
        **desk.initial,
        "hardware_class": earlier.hardware_class.slug,
        "environment": earlier.environment.slug,
        "lots": earlier.lot_count,
        "days": earlier.days,
    }
    filled = {
        **choices,
        "contact_name": earlier.contact_name,
        "contact_email": earlier.contact_email,
        "organisation": earlier.organisation,
        "messenger": earlier.messenger,
        "ssh_keys": "\n".join(key.public_key for key in earlier.ssh_keys.all()),
        "carry_from": earlier.public_id if kept else "",
        "carry_token": token if kept else "",
        "carry_data": kept is not None,
    }
    form = BookingForm(initial=filled, **desk.form_kwargs)
    quote_form = QuoteForm(choices, **desk.form_kwargs)
    extra = {"carry": {"order": earlier, "access": kept}, "language_next": request.path}
    response = _draw(request, desk, form=form, fit_form=None, quote_form=quote_form, extra_context=extra)
    return mark_private(response)


def _ask_again_for_terms(form: BookingForm, *, terms: TermsVersion | None) -> None:
    """The form comes back with everything typed but the acceptance, and the current version to accept."""
    data = form.data.copy()
    data.pop("accept_terms", None)
    data["terms_version"] = str(terms.pk) if terms else ""
    form.data = data


def _draw(
    request: HttpRequest,
    desk: _Desk,
    *,
    form: BookingForm,
    fit_form: FitForm | None,
    quote_form: QuoteForm | None,
    status: int = 200,
    extra_context: dict | None = None,
) -> HttpResponse:
    quote = _quote_for(quote_form, catalog=desk.catalog, policy=desk.policy, initial=desk.initial)
    context = {
        "form": form,
        "fit_form": fit_form or FitForm(prefix="fit"),
        "quote": quote,
        "catalog": desk.catalog,
        "policy": desk.policy,
        "terms": desk.terms,
        **(extra_context or {}),
    }
    if request.htmx and request.method == "GET":
        return render(request, "customer/book.html#quote", context)
    return render(request, "customer/book.html", context, status=status)


def _sold_out_page(request: HttpRequest, form: BookingForm, sold_out: SoldOut) -> HttpResponse:
    """A short answer: what happened, the next dates as one-click bookings with the same answers, and the way
    back to the form with everything kept. Drawn for each visitor: it carries what they typed."""
    fields = [*BookingForm.base_fields, *(f"fit-{name}" for name in FitForm.base_fields)]

    def kept_but(*left_out: str):
        return format_html_join(
            "",
            '<input type="hidden" name="{}" value="{}">',
            ((name, value) for name in fields if name not in left_out for value in request.POST.getlist(name)),
        )

    data = form.cleaned_data
    context = {
        "message": sold_out.message,
        "next_dates": sold_out.next_dates,
        "kept": kept_but("start_date"),
        # the next dates book a dated window: "as soon as ready" is what was sold out
        "kept_dated": kept_but("start_date", "start_when_ready"),
        "start_when_ready": data["start_when_ready"],
        "start_date": data["start_date"],
        "days": data["days"],
        "lot_count": data["lots"],
        "hardware_class": data["hardware_class"],
        "language_next": reverse("customer:book"),
    }
    return render(request, "customer/sold_out.html", context)


def _booking_request(
    form: BookingForm,
    *,
    language: str,
    client_key: str,
    carry: placing.DataCarry | None = None,
    contact_confirmed: bool = False,
    **fit,
) -> placing.BookingRequest:
    data = form.cleaned_data
    return placing.BookingRequest(
        **fit,
        carry=carry,
        contact_confirmed=contact_confirmed,
        client_key=client_key,
        hardware_class=data["hardware_class"],
        environment=data["environment"],
        lot_count=data["lots"],
        start_date=data["start_date"] or timezone.now().date(),
        start_when_ready=data["start_when_ready"],
        archcheck_report=data["archcheck_report"],
        days=data["days"],
        contact=placing.Contact(
            name=data["contact_name"].strip(),
            email=data["contact_email"].strip(),
            organisation=data["organisation"].strip(),
            messenger=data["messenger"].strip(),
        ),
        ssh_keys=data["ssh_keys"],
        research=placing.Research(
            sharing=data["sharing"],
            hypothesis=data["hypothesis"],
            detail=data["hypothesis_detail"].strip(),
            measure=data["hypothesis_measure"].strip(),
            checkpoint_interval_hours=data["checkpoint_interval_hours"],
            stop_criteria=data["stop_criteria"].strip(),
            checkpoint_dir=data["checkpoint_dir"],
        ),
        notes=data["notes"].strip(),
        terms_version_id=data["terms_version"],
        billing=BillingDetails(
            organisation=data["organisation"],
            address=data["billing_address"],
            country=data["billing_country"],
            vat_number=data["vat_number"],
            purchase_order=data["purchase_order"],
        ),
        language=language if language in dict(settings.LANGUAGES) else settings.LANGUAGE_CODE,
    )


@require_http_methods(["GET", "POST"])
def resend_link(request: HttpRequest) -> HttpResponse:
    form = ResendLinkForm(request.POST or None)
    sent = False
    if request.method == "POST" and form.is_valid():  # only a well-formed address counts against the limits
        email = form.cleaned_data["email"].strip().lower()
        allowed = _mailing_allowed(request, group="resend-link", email=email)
        if allowed is None:
            return render(request, "429.html", status=429)
        if allowed:
            links.orders_request_links(email=email, language=get_language())
        sent = True
    return render(request, "customer/resend_link.html", {"form": form, "sent": sent})


def _mailing_allowed(request: HttpRequest, *, group: str, email: str) -> bool | None:
    """The limits of a form that mails an address: None when this client asked too often (the page answers 429);
    False when the address had its e-mails for the hour, which is no error to show: whoever asked, one went to that
    mailbox a moment ago (a stranger spending the address's limit locks no one out); True to send."""
    rate = settings.RATELIMIT_RESEND_LINK
    if is_ratelimited(request, group=f"{group}-ip", key="ip", rate=rate, increment=True):
        return None
    # The address's own limit keeps its mailbox from being flooded.
    return not is_ratelimited(
        request, group=f"{group}-email", key=lambda _group, _request: email, rate=rate, increment=True
    )


@require_http_methods(["POST"])
def confirm_address(request: HttpRequest) -> HttpResponse:
    """The booking form's "e-mail me a confirmation link" (its button posts the whole form here): a link is mailed
    to the contact address typed, and the form comes back with everything kept, to be sent again once the link was
    opened in this browser. The same limits as "resend my links": per client, and per address (reaching the
    address's own says nothing: the link went to that mailbox a moment ago)."""
    form = ConfirmAddressForm(request.POST)
    if not form.is_valid():
        return _booking_page(request, {"confirm_address_error": form.errors["contact_email"][0]})
    email = form.cleaned_data["contact_email"].strip().lower()
    allowed = _mailing_allowed(request, group="confirm-address", email=email)
    if allowed is None:
        return render(request, "429.html", status=429)
    if allowed:
        links.address_request_confirmation(email=email, language=get_language())
    return _booking_page(request, {"confirmation_sent": email})


@require_http_methods(["GET"])
@never_cache
def address_confirmed(request: HttpRequest, signed: str) -> HttpResponse:
    """The confirmation link, opened: this browser reads that mailbox (web/customer/addresses.py)."""
    email = links.address_confirmed(signed=signed)
    if email is not None:
        addresses.remember(request, email)
    response = render(request, "customer/address_confirmed.html", {"email": email}, status=200 if email else 400)
    return mark_private(response)


@require_http_methods(["GET"])
def calendar(request: HttpRequest) -> HttpResponse:
    """The public availability calendar: per class, the next eight weeks of free lot counts for a window of the
    chosen length (nothing of whose they are). A day with enough free lots links to the booking page with that
    start date, the earliest start as soon as ready is said above it."""
    catalog, policy = _catalog_and_policy()
    form = CalendarForm(request.GET, catalog=catalog, max_lots=policy.max_lots_per_order)
    choice = form.choice()
    hardware_class = choice["hardware_class"]
    context = {"form": form, "catalog": catalog, "choice": choice, "weeks": [], "ready": None}
    if hardware_class is not None:
        days = selectors.availability_calendar(hardware_class=hardware_class, days=choice["days"], policy=policy)
        lead = days[0].day.weekday()  # the first week starts on a Monday: the days before today are blank
        cells = [None] * lead + days
        context["weeks"] = [cells[index : index + 7] for index in range(0, len(cells), 7)]
        context["ready"] = selectors.ready_start(
            hardware_class=hardware_class, days=choice["days"], lot_count=choice["lots"], policy=policy
        )
    return render(request, "customer/calendar.html", context)


@require_http_methods(["POST"])
def archcheck_verdict(request: HttpRequest) -> HttpResponse:
    """The booking page's live answer to an archcheck report (htmx posts the form with its file): per class on
    offer, whether the researcher's compiled extensions run on it, and what to rebuild with which flag."""
    if is_ratelimited(request, group="archcheck-verdict", key="ip", rate="60/m", method="POST", increment=True):
        return render(request, "429.html", status=429)
    catalog, _policy = _catalog_and_policy()
    upload = request.FILES.get("archcheck_report")
    context = {"verdicts": [], "error": ""}
    if upload is None:
        context["error"] = _("Choose the report file (report.json) written by archcheck.py.")
    else:
        try:
            report = archcheck_from_upload(upload)
        except ValidationError as exc:
            context["error"] = exc.messages[0]
        else:
            context["verdicts"] = archcheck_report.verdicts_for(report, catalog.classes)
    return render(request, "customer/_archcheck_verdict.html", context)


@require_http_methods(["GET"])
def guide(request: HttpRequest) -> HttpResponse:
    """The researcher's guide, written per language (long-form text reads better than translated fragments)."""
    language = request.LANGUAGE_CODE if request.LANGUAGE_CODE in dict(settings.LANGUAGES) else "en"
    return render(request, f"customer/guide_{language}.html")


@require_http_methods(["GET"])
def fit_advisor(request: HttpRequest) -> HttpResponse:
    """The memory-fit advisor: its own page, and the live partial of the booking page (htmx)."""
    form = FitForm(request.GET if request.GET.get("fit-parameters_billion") else None, prefix="fit")
    catalog, _policy = _catalog_and_policy()
    advice = _fit_advice(form, hypothesis=request.GET.get("hypothesis", "")[:40], catalog=catalog)
    context = {"fit_form": form, "advice": advice}
    if request.htmx:
        return render(request, "customer/fit.html#advice", context)
    return render(request, "customer/fit.html", context)


def _fit_advice(form: FitForm, *, hypothesis: str, catalog: Catalog) -> dict | None:
    if not form.is_bound or not form.is_valid():
        return None
    inputs = form.fit_input()
    if inputs is None:
        return None
    return advisor.advise(
        inputs=inputs, classes=catalog.classes, hypothesis=hypothesis, rocm_ready=form.cleaned_data["rocm_ready"]
    )


def _tool(name: str) -> HttpResponse:
    """A researcher's tool as one file (nodekit.bundle), downloaded under its own name."""
    response = HttpResponse(script_bytes(name), content_type="text/x-python; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}.py"'
    return response


@require_http_methods(["GET"])
def split_trial_kit(request: HttpRequest) -> HttpResponse:
    """The split-trial kit, also in each order's container at /opt/binome/ (the kit provisioning writes)."""
    return _tool("split_trial")


@require_http_methods(["GET"])
def archcheck(request: HttpRequest) -> HttpResponse:
    """archcheck.py: before booking, which classes the researcher's compiled extensions carry code for."""
    return _tool("archcheck")
