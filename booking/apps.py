from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.utils.translation import gettext_lazy as _


def _catalog_changed(**kwargs) -> None:
    from booking.page_cache import bump_generation

    bump_generation()


def _order_changed(sender, instance, **kwargs) -> None:
    from booking.models import Order
    from booking.status_cache import bump_order_numbers, bump_orders

    if isinstance(instance, Order):
        bump_order_numbers(instance.public_id)
    else:
        bump_orders(instance.order_id)


def _transfer_changed(sender, instance, **kwargs) -> None:
    from booking.status_cache import bump_orders
    from payments.models import Invoice

    if instance.invoice_id is not None:
        bump_orders(*Invoice.objects.filter(pk=instance.invoice_id).values_list("order_id", flat=True))


class BookingConfig(AppConfig):
    name = "booking"
    verbose_name = _("Booking")

    def ready(self) -> None:
        # Admin edits of the catalog or the fleet change what the booking page shows: drop its cached copies.
        # (Bookings and releases bump the generation in the services themselves.)
        from booking.models import (
            BookingPolicy,
            EnvironmentImage,
            HardwareClass,
            Lot,
            Order,
            OrderAccessToken,
            OrderEvent,
            Price,
        )
        from payments.models import Invoice, Transfer
        from provisioning.models import Access, Host

        for model in (HardwareClass, EnvironmentImage, Price, Lot, BookingPolicy, Host):
            post_save.connect(_catalog_changed, sender=model, dispatch_uid=f"page-cache-{model.__name__}")
            post_delete.connect(_catalog_changed, sender=model, dispatch_uid=f"page-cache-del-{model.__name__}")
        m2m_changed.connect(
            _catalog_changed, sender=EnvironmentImage.hardware_classes.through, dispatch_uid="page-cache-m2m"
        )

        # Every save or delete of what the order page's status block shows makes its cached copies stale
        # (booking/status_cache.py); queryset updates bump in the services that make them.
        for model in (Order, OrderEvent, Invoice, Access, OrderAccessToken):
            post_save.connect(_order_changed, sender=model, dispatch_uid=f"status-cache-{model.__name__}")
            post_delete.connect(_order_changed, sender=model, dispatch_uid=f"status-cache-del-{model.__name__}")
        post_save.connect(_transfer_changed, sender=Transfer, dispatch_uid="status-cache-Transfer")
        post_delete.connect(_transfer_changed, sender=Transfer, dispatch_uid="status-cache-del-Transfer")
