from django.apps import AppConfig


class ProvisioningConfig(AppConfig):
    name = "provisioning"
    verbose_name = "Provisioning"

    def ready(self) -> None:
        from booking.apps import connect_availability
        from booking.signals import order_status_changed
        from provisioning import (
            checks,  # noqa: F401 (registers the production checks)
            services,
        )
        from provisioning.models import Host

        # Hosts carry lots: a host taken out of service or found not isolated changes what can be booked.
        connect_availability(Host, app="provisioning")
        order_status_changed.connect(services.on_order_status_changed, dispatch_uid="provisioning-lifecycle")
