from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.utils.translation import gettext_lazy as _


def _catalog_changed(**kwargs) -> None:
    from booking.page_cache import bump_generation

    bump_generation()


class BookingConfig(AppConfig):
    name = "booking"
    verbose_name = _("Booking")

    def ready(self) -> None:
        # Admin edits of the catalog or the fleet change what the booking page shows: drop its cached copies.
        # (Bookings and releases bump the generation in the services themselves.)
        from booking.models import BookingPolicy, EnvironmentImage, HardwareClass, Lot, Price
        from provisioning.models import Host

        for model in (HardwareClass, EnvironmentImage, Price, Lot, BookingPolicy, Host):
            post_save.connect(_catalog_changed, sender=model, dispatch_uid=f"page-cache-{model.__name__}")
            post_delete.connect(_catalog_changed, sender=model, dispatch_uid=f"page-cache-del-{model.__name__}")
        m2m_changed.connect(
            _catalog_changed, sender=EnvironmentImage.hardware_classes.through, dispatch_uid="page-cache-m2m"
        )
