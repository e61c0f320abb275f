from django.apps import AppConfig


def _transfer_changed(sender, instance, **kwargs) -> None:
    from booking.status_cache import bump_orders
    from payments.models import Invoice

    if instance.invoice_id is not None:
        bump_orders(*Invoice.objects.filter(pk=instance.invoice_id).values_list("order_id", flat=True))


def _cursor_changed(sender, instance, update_fields=None, **kwargs) -> None:
    """A chain that stops or starts answering changes every order page that says "check delayed"."""
    from booking.status_cache import bump_chains

    if update_fields is None or "unavailable_since" in update_fields:
        bump_chains()


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = "Payments"

    def ready(self) -> None:
        from celery.signals import worker_ready
        from django.core.checks import register
        from django.db.models.signals import post_delete, post_save

        from booking.apps import connect_page_signals
        from booking.signals import order_status_changed
        from payments import settlement
        from payments.checks import chain_contracts_match_the_chains_file, log_chain_checks
        from payments.models import ChainCursor, Invoice, Transfer

        connect_page_signals(app="payments", order_rows=(Invoice,))
        post_save.connect(_transfer_changed, sender=Transfer, dispatch_uid="status-cache-Transfer")
        post_delete.connect(_transfer_changed, sender=Transfer, dispatch_uid="status-cache-del-Transfer")
        post_save.connect(_cursor_changed, sender=ChainCursor, dispatch_uid="status-cache-ChainCursor")
        order_status_changed.connect(settlement.on_order_status_changed, dispatch_uid="payments-refunds")
        register(chain_contracts_match_the_chains_file, "payments", deploy=True)
        worker_ready.connect(log_chain_checks, dispatch_uid="payments-chain-checks", weak=False)
