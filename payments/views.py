"""The order page's payment actions: "I've paid" and changing the asset. Parse, call one service, answer."""

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST
from django_ratelimit.core import is_ratelimited

from booking.views import _order_or_404, order_page
from payments import invoices, selectors
from payments.errors import PaymentError
from portal.numbers import whole_number


@require_POST
@never_cache
def invoice_paid(request: HttpRequest, public_id: str, token: str) -> HttpResponse:
    order = _order_or_404(public_id, token)
    if is_ratelimited(request, group="i-paid", key="ip", rate="30/h", method="POST", increment=True):
        messages.error(request, _("You pressed “I've paid” many times: we keep checking the chain on our own."))
        return redirect("booking:order", public_id=public_id, token=token)
    invoice_id = whole_number(request.POST.get("invoice"))
    invoice = (
        order.invoices.filter(pk=invoice_id).first() if invoice_id is not None else selectors.current_invoice(order)
    )
    if invoice is None:
        messages.error(request, _("This order has no invoice to pay."))
    else:
        try:
            invoices.invoice_customer_paid(invoice=invoice, tx_hint=request.POST.get("tx_hint", "")[:200])
        except PaymentError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(
                request, _("Thank you. We are looking for your transfer on chain; this page updates by itself.")
            )
    if request.htmx:
        return order_page(request, order, token)
    return redirect("booking:order", public_id=public_id, token=token)


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
    return redirect("booking:order", public_id=public_id, token=token)
