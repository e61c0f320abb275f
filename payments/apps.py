from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = "Payments"

    def ready(self) -> None:
        from celery.signals import worker_ready
        from django.core.checks import register

        from booking.signals import order_status_changed
        from payments import (
            fiscal,
            settlement,
            tasks,  # noqa: F401 (registers the tasks that payments/enqueue.py queues by name)
            unapplied,
        )
        from payments.checks import chain_contracts_match_the_chains_file, log_chain_checks, payments_settings

        order_status_changed.connect(settlement.on_order_status_changed, dispatch_uid="payments-refunds")
        order_status_changed.connect(fiscal.on_order_status_changed, dispatch_uid="payments-credit-notes")
        order_status_changed.connect(unapplied.on_order_expired, dispatch_uid="payments-unapplied")
        register(payments_settings, "payments")
        register(chain_contracts_match_the_chains_file, "payments", deploy=True)
        worker_ready.connect(log_chain_checks, dispatch_uid="payments-chain-checks", weak=False)
