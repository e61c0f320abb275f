"""Thin Celery wrappers: ids in, fresh rows loaded, one service called."""

from celery import shared_task
from django.conf import settings
from django.core.validators import validate_email

from booking import links, notices, services
from booking.models import Order, OrderStatus


@shared_task(name="booking.expire_holds")
def expire_holds() -> int:
    return services.orders_expire_stale_holds() + services.extension_holds_release()


@shared_task(name="booking.send_order_link", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_order_link(order_id: int) -> None:
    order = Order.objects.filter(pk=order_id).first()
    if order is not None:
        links.order_send_link(order=order)


@shared_task(name="booking.send_order_links", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_order_links(email: str, language: str) -> int:
    # Task arguments are input like any other: re-validate before use.
    validate_email(email)
    language = language if language in dict(settings.LANGUAGES) else settings.LANGUAGE_CODE
    return links.orders_send_links(email=email, language=language)


@shared_task(name="booking.send_address_confirmation", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_address_confirmation(email: str, language: str) -> None:
    validate_email(email)  # task arguments are input like any other
    language = language if language in dict(settings.LANGUAGES) else settings.LANGUAGE_CODE
    links.address_send_confirmation(email=email, language=language)


@shared_task(name="booking.send_order_cancelled", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_order_cancelled(order_id: int) -> None:
    """The written confirmation of a paid order cancelled by its customer, with the refund its terms give."""
    order = (
        Order.objects.filter(pk=order_id, status=OrderStatus.CANCELLED).first() if isinstance(order_id, int) else None
    )
    if order is not None and order.refund_due is not None:
        notices.send(notices.Notice.ORDER_CANCELLED, order=order, refund_due=order.refund_due)
