from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.utils.translation import gettext_lazy as _


def connect_availability(*models, app: str) -> None:
    """Saves and deletes of these models change what can be booked (booking/availability.py)."""
    from booking import availability

    for model in models:
        post_save.connect(availability.changed, sender=model, dispatch_uid=f"availability-{app}-{model.__name__}")
        post_delete.connect(availability.changed, sender=model, dispatch_uid=f"availability-del-{app}-{model.__name__}")


class BookingConfig(AppConfig):
    name = "booking"
    verbose_name = _("Booking")

    def ready(self) -> None:
        # Admin edits of the catalog or the fleet, and single saves of allocations, change what can be booked
        # (allocations' bulk writes say so themselves: AllocationQuerySet).
        from booking import (
            availability,
            tasks,  # noqa: F401 (registers the tasks that booking/enqueue.py queues by name)
        )
        from booking.models import Allocation, BookingPolicy, EnvironmentImage, Price
        from inventory.models import HardwareClass, Host, Lot, MaintenanceWindow

        connect_availability(
            HardwareClass,
            EnvironmentImage,
            Price,
            Lot,
            Host,
            MaintenanceWindow,
            BookingPolicy,
            Allocation,
            app="booking",
        )
        m2m_changed.connect(
            availability.changed, sender=EnvironmentImage.hardware_classes.through, dispatch_uid="availability-m2m"
        )
