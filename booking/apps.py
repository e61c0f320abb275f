from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.utils.translation import gettext_lazy as _


def catalog_changed(**kwargs) -> None:
    """A receiver for saves and deletes of what the booking page shows: drop its cached copies."""
    from booking.page_cache import bump_generation

    bump_generation()


def order_changed(sender, instance, **kwargs) -> None:
    """A receiver for saves and deletes of the order, or of a row with an `order_id` that the order page shows:
    renderings of the status block drawn before are no longer current (booking/status_cache.py)."""
    from booking.models import Order
    from booking.status_cache import bump_order_numbers, bump_orders

    if isinstance(instance, Order):
        bump_order_numbers(instance.public_id)
    else:
        bump_orders(instance.order_id)


def connect_page_signals(*, catalog=(), order_rows=(), app: str) -> None:
    """Connect the page caches' receivers for an app's models (each app connects its own, in its `apps.py`)."""
    for model in catalog:
        post_save.connect(catalog_changed, sender=model, dispatch_uid=f"page-cache-{app}-{model.__name__}")
        post_delete.connect(catalog_changed, sender=model, dispatch_uid=f"page-cache-del-{app}-{model.__name__}")
    for model in order_rows:
        post_save.connect(order_changed, sender=model, dispatch_uid=f"status-cache-{app}-{model.__name__}")
        post_delete.connect(order_changed, sender=model, dispatch_uid=f"status-cache-del-{app}-{model.__name__}")


class BookingConfig(AppConfig):
    name = "booking"
    verbose_name = _("Booking")

    def ready(self) -> None:
        # Admin edits of the catalog or the fleet change what the booking page shows: drop its cached copies.
        # (Bookings and releases bump the generation in the services themselves.) Every save or delete of what
        # the order page's status block shows makes its renderings stale.
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

        connect_page_signals(
            app="booking",
            catalog=(HardwareClass, EnvironmentImage, Price, Lot, BookingPolicy),
            order_rows=(Order, OrderEvent, OrderAccessToken),
        )
        m2m_changed.connect(
            catalog_changed, sender=EnvironmentImage.hardware_classes.through, dispatch_uid="page-cache-m2m"
        )
