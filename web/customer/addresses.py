"""The e-mail addresses this browser proved it reads: a link e-mailed there was opened in it (an order's link, or
the confirmation link the booking form offers). A booking of such an address is confirmed from the start, and the
class's share of unconfirmed holds does not apply to it (booking.placing). Kept in the session, never in a cookie
of its own: the session's signature is the proof."""

from django.http import HttpRequest

SESSION_KEY = "binome_confirmed_addresses"
MAX_REMEMBERED = 5


def remember(request: HttpRequest, email: str) -> None:
    email = email.strip().lower()
    known = [address for address in request.session.get(SESSION_KEY, []) if isinstance(address, str)]
    if email and email not in known:
        request.session[SESSION_KEY] = [*known, email][-MAX_REMEMBERED:]


def confirmed(request: HttpRequest, email: str) -> bool:
    return email.strip().lower() in request.session.get(SESSION_KEY, [])
