"""The order's secret links: minted (only their hash is kept), mailed, revoked, and sent again on request."""

from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.core import signing
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from booking import enqueue, notices, selectors
from booking.locks import lock_order
from booking.models import Order, OrderAccessToken, OrderEvent
from booking.notices import Notice
from booking.services import order_note
from booking.tokens import new_access_token, token_hash

# The pages these links open are served above booking (web/customer/urls.py): the layer that serves them tells
# booking how their paths are built when it is ready (web/apps.py, `serve_links`), so booking names none of its URLs.
_paths: dict[str, Callable[..., str]] = {}


def serve_links(*, order: Callable[..., str], address_confirmed: Callable[..., str]) -> None:
    """Called by the layer that serves the pages: `order(public_id=, token=)` and `address_confirmed(signed=)` answer
    the path of each page (the site's base, SITE_URL, is added here)."""
    _paths.update(order=order, address_confirmed=address_confirmed)


def _link(page: str, **kwargs: str) -> str:
    try:
        path = _paths[page]
    except KeyError:
        raise ImproperlyConfigured(
            f"No installed app serves booking's {page} page (web.apps.WebConfig does)."
        ) from None
    return settings.SITE_URL + path(**kwargs)


# The links of an order that work at once: each new one retires the oldest beyond this, so resends and end-of-window
# e-mails never pile up live secrets.
MAX_LIVE_LINKS = 5


def issue_token(*, order: Order, mailed: bool = False) -> str:
    """A new secret link to the order; `mailed` for one that goes to the contact's address by e-mail."""
    token = new_access_token()
    OrderAccessToken.objects.create(order=order, token_hash=token_hash(token), mailed=mailed)
    keep = order.access_tokens.order_by("-created_at", "-pk").values_list("pk", flat=True)[:MAX_LIVE_LINKS]
    order.access_tokens.exclude(pk__in=list(keep)).delete()
    return token


def order_link(*, order: Order, token: str) -> str:
    return _link("order", public_id=order.public_id, token=token)


def mailed_order_link(*, order: Order) -> str:
    """A fresh secret link to the order for an e-mail to its contact, minted where the e-mail is written (so no
    secret travels through the broker)."""
    return order_link(order=order, token=issue_token(order=order, mailed=True))


def order_send_link(*, order: Order) -> None:
    """E-mail a fresh secret link to the order's contact."""
    notices.send(Notice.ORDER_LINK, order=order, link=mailed_order_link(order=order))


def link_opened(*, order: Order, token: str, now: datetime | None = None) -> None:
    """A link was opened. The first time one that was sent by e-mail is, the order's contact address is confirmed
    (one UPDATE; nothing once confirmed)."""
    if order.email_verified_at is not None:
        return
    mailed = getattr(order, "link_mailed", None)  # read with the order (selectors.order_for_link)
    if mailed is None:
        mailed = order.access_tokens.filter(token_hash=token_hash(token), mailed=True).exists()
    if mailed:
        now = now or timezone.now()
        Order.objects.filter(pk=order.pk, email_verified_at__isnull=True).update(email_verified_at=now)
        order.email_verified_at = now


@transaction.atomic
def order_links_revoke(*, order: Order, token: str) -> int:
    """Every secret link of the order stops working at once (the one used included); a new one is mailed to the
    order's contact, minted by the task so that no secret travels through the broker. Returns how many links
    were revoked: 0, and no e-mail, when the link used was revoked meanwhile (parallel presses, checked under the
    order's lock: one revocation, one e-mail)."""
    order = lock_order(order.pk)
    if not order.access_tokens.filter(token_hash=token_hash(token)).exists():
        return 0
    revoked, _by_model = order.access_tokens.all().delete()  # post_delete: the status polls of old links stop
    order_note(order=order, reason="links revoked", actor_kind=OrderEvent.Actor.CUSTOMER, evidence={"links": revoked})
    enqueue.send_order_link(order.pk)
    return revoked


def orders_send_links(*, email: str, language: str, now: datetime | None = None) -> int:
    """E-mail fresh links to every recent order of an address. Sends nothing when there is none."""
    now = now or timezone.now()
    orders = list(selectors.orders_for_email(email=email, since=now - timedelta(days=400))[:20])
    if not orders:
        return 0
    links = [(order, mailed_order_link(order=order)) for order in orders]
    notices.send(Notice.ORDER_LINKS, to=orders[0].contact_email, language=language, links=links)
    return len(orders)


def orders_request_links(*, email: str, language: str) -> None:
    """Ask for fresh links by e-mail. Same work whether or not the address has orders (nothing to learn)."""
    enqueue.send_order_links(email.strip().lower(), language)


# A link proving that its opener reads a mailbox, before any order of theirs exists: the booking of a contact who
# confirmed their address is not counted in the class's share of unconfirmed holds (booking.placing).
ADDRESS_CONFIRMATION_SALT = "binome.booking.address-confirmation"
ADDRESS_CONFIRMATION_MAX_AGE = timedelta(hours=1)


def address_confirmation_link(*, email: str) -> str:
    """A signed, expiring link for `email` (minted where it is mailed: no secret travels through the broker)."""
    value = signing.dumps(email.strip().lower(), salt=ADDRESS_CONFIRMATION_SALT, compress=True)
    return _link("address_confirmed", signed=value)


def address_confirmed(*, signed: str) -> str | None:
    """The address a confirmation link was made for, or None when it is forged or older than an hour."""
    try:
        email = signing.loads(
            signed[:1000], salt=ADDRESS_CONFIRMATION_SALT, max_age=ADDRESS_CONFIRMATION_MAX_AGE.total_seconds()
        )
    except signing.BadSignature:  # SignatureExpired too
        return None
    return email if isinstance(email, str) and "@" in email and len(email) <= 254 else None


def address_send_confirmation(*, email: str, language: str) -> None:
    notices.send(
        Notice.ADDRESS_CONFIRMATION,
        to=email,
        language=language,
        link=address_confirmation_link(email=email),
        valid_minutes=int(ADDRESS_CONFIRMATION_MAX_AGE.total_seconds() // 60),
    )


def address_request_confirmation(*, email: str, language: str) -> None:
    enqueue.send_address_confirmation(email.strip().lower(), language)
