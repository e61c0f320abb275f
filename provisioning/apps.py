from django.apps import AppConfig


class ProvisioningConfig(AppConfig):
    name = "provisioning"
    verbose_name = "Provisioning"

    def ready(self) -> None:
        from booking.apps import connect_page_signals
        from booking.signals import order_status_changed
        from provisioning import (
            checks,  # noqa: F401 (registers the production checks)
            services,
        )
        from provisioning.models import Access, Host, ProvisioningRun

        # Hosts carry lots (the booking page); accesses are what the order page shows once ready, runs the
        # progress while they are prepared (a run is saved as each step starts).
        connect_page_signals(app="provisioning", catalog=(Host,), order_rows=(Access, ProvisioningRun))
        order_status_changed.connect(services.on_order_status_changed, dispatch_uid="provisioning-lifecycle")
