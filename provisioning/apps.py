from django.apps import AppConfig


class ProvisioningConfig(AppConfig):
    name = "provisioning"
    verbose_name = "Provisioning"

    def ready(self) -> None:
        from booking.signals import order_status_changed
        from provisioning import (
            checks,  # noqa: F401 (registers the production checks)
            services,
            tasks,  # noqa: F401 (registers the tasks that provisioning/enqueue.py queues by name)
        )

        order_status_changed.connect(services.on_order_status_changed, dispatch_uid="provisioning-lifecycle")
