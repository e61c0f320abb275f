"""The presentation layer: the customer pages, the operator console and the e-mails, above every app.

Everything the pages cache is invalidated from here, in one place:
- the order page's status block (web/status_cache.py): every save or delete of a row it shows, in whichever app
  owns the row, and a chain that stops or starts answering;
- the booking page (web/page_cache.py) is keyed by what can be booked, a generation booking keeps for its own
  availability hint (booking/availability.py); there is nothing more to connect for it.
The e-mails are written here from the apps' notices (booking/notices.py, web/mail.py).
The paths of the pages booking's secret links open are given to booking here too (booking/links.py `serve_links`).
"""

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


def _order_row_changed(sender, instance, **kwargs) -> None:
    """The order, or a row with an `order_id` that the order page shows, was saved or deleted: renderings of the
    status block drawn before are no longer current."""
    from booking.models import Order
    from web import status_cache

    if isinstance(instance, Order):
        status_cache.bump_order_numbers(instance.public_id)
    else:
        status_cache.bump_orders(instance.order_id)


def _transfer_changed(sender, instance, **kwargs) -> None:
    from payments.models import Invoice
    from web import status_cache

    if instance.invoice_id is not None:
        status_cache.bump_orders(*Invoice.objects.filter(pk=instance.invoice_id).values_list("order_id", flat=True))


def _cursor_changed(sender, instance, update_fields=None, **kwargs) -> None:
    """A chain that stops or starts answering changes every order page that says "check delayed"."""
    from web import status_cache

    if update_fields is None or "unavailable_since" in update_fields:
        status_cache.bump_chains()


def _on_save_and_delete(receiver, model, name: str) -> None:
    post_save.connect(receiver, sender=model, dispatch_uid=f"web-{name}-{model._meta.label}")
    post_delete.connect(receiver, sender=model, dispatch_uid=f"web-{name}-del-{model._meta.label}")


class WebConfig(AppConfig):
    name = "web"
    verbose_name = "Pages"

    def ready(self) -> None:
        from django.urls import reverse

        from booking import links
        from booking.models import Order, OrderAccessToken, OrderEvent
        from booking.notices import notice
        from payments.fiscal_documents import document_html
        from payments.models import ChainCursor, Invoice, Transfer
        from provisioning import research_record
        from provisioning.models import Access, ProvisioningRun
        from web import mail
        from web.invoice_document import fiscal_invoice_html
        from web.record_document import research_record_html

        # What the order page's status block shows: the order, its events and links, its invoices and their
        # transfers, its accesses once ready and its runs while they are prepared (a run is saved per step).
        for model in (Order, OrderEvent, OrderAccessToken, Invoice, Access, ProvisioningRun):
            _on_save_and_delete(_order_row_changed, model, "order-status")
        _on_save_and_delete(_transfer_changed, Transfer, "order-status")
        post_save.connect(_cursor_changed, sender=ChainCursor, dispatch_uid="web-order-status-ChainCursor")
        notice.connect(mail.write, dispatch_uid="web-mail")
        # The invoice's page, printed to PDF/A-3 by payments.
        document_html.connect(fiscal_invoice_html, dispatch_uid="web-fiscal-invoice")
        # The research record's page, printed to PDF by provisioning.
        research_record.document_html.connect(research_record_html, dispatch_uid="web-research-record")
        # The customer pages booking's secret links open: booking builds the links, the pages' URLconf their paths.
        links.serve_links(
            order=lambda **kwargs: reverse("customer:order", kwargs=kwargs),
            address_confirmed=lambda **kwargs: reverse("customer:address-confirmed", kwargs=kwargs),
        )
