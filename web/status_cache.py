"""The order page's "unchanged" answer: which rendering of the live status block is still current.

Every open order page polls its status block (`customer/order.html#order-status`) every few seconds, and nearly
every answer is "nothing changed". Each rendering of the block, in the full page or alone, gets an id that is
written into the block's own poll URL (`?v=`), and a small record under that id: the link it was rendered for
(order number and token hash) and the versions of what it shows:

- the order's version (`order_key`, by order number), replaced on commit by every save or delete of the order,
  its events, its links, its invoices and their transfers, its accesses (model signals, all connected in
  web/apps.py; services save what the page shows with `update_fields`, never a
  queryset `.update()`, so that every such write goes through them);
- the chains' version (`CHAINS_KEY`), replaced when a chain becomes unreachable or answers again ("check
  delayed" depends on the chain's cursor, not only on the invoice).

A poll naming a record whose versions are still the current ones, for the same link, is answered "204 No
Content" (htmx keeps the block) by `web.poll.UnchangedStatusMiddleware`, before sessions, locale,
CSRF, authentication and messages run: one cache round trip of three small values, no query. Anything else is
rendered afresh by the view. Versions are random, so a value evicted and set again cannot match an older
record; records expire after `RECORD_TTL` seconds, and sooner when the block's text depends on the time (the
warning before the end of an active window).
"""

import re
import secrets

from django.core.cache import cache
from django.db import transaction

from booking.tokens import token_hash

# Freshness rests on the versions, not on this: a record only has to die for the text that moves with the clock
# (`fresh_for`) and for a language switched in another tab. Each expiry costs the open page a full rendering of
# its block (six queries and the template: dozens of times the work of a 204); at 30 s, one poll in six was one.
RECORD_TTL = 300
VERSION_TTL = 24 * 3600  # longer than any record; a version that expired is set again at random
CHAINS_KEY = "order-status:chains:version"
RENDERING_ID = re.compile(r"[0-9a-f]{16}")  # what `new_token` makes: anything else names no rendering


PUBLIC_ID_MAX = 16  # an order number is "BN-" and 8 characters; a longer one names no order


def order_key(public_id: str) -> str:
    return f"order-status:order:{public_id}:version"


def shown_key(rendering_id: str) -> str:
    return f"order-status:shown:{rendering_id}"


def _link(public_id: str, token: str) -> str:
    return f"{public_id}:{token_hash(token)}"


def new_token() -> str:
    """A fresh random value: an order's or the chains' version, a rendering's id."""
    return secrets.token_hex(8)


def bump_orders(*order_ids: int | None) -> None:
    """Make the renderings of these orders stale, once the current transaction (if any) commits."""
    from booking.models import Order

    ids = {order_id for order_id in order_ids if order_id is not None}
    if ids:
        transaction.on_commit(
            lambda: _bump(Order.objects.filter(pk__in=ids).values_list("public_id", flat=True)), robust=True
        )


def bump_order_numbers(*public_ids: str) -> None:
    """`bump_orders` for orders known by number (a deleted order, whose id finds nothing after the commit)."""
    transaction.on_commit(lambda: _bump(public_ids), robust=True)


def _bump(public_ids) -> None:
    cache.set_many({order_key(public_id): new_token() for public_id in public_ids}, timeout=VERSION_TTL)


def bump_chains() -> None:
    """Make every rendering that may show a chain's availability stale, on commit."""
    transaction.on_commit(lambda: cache.set(CHAINS_KEY, new_token(), timeout=VERSION_TTL), robust=True)


def current_versions(public_id: str) -> dict[str, str]:
    """The versions a rendering is made at: read *before* the rendering reads the database, so that a write
    committed meanwhile leaves the rendering older than the version its bump sets. A version missing here (never
    set, or evicted) is set by `remember_rendering`, for the next rendering. An address whose number cannot be an
    order's reads nothing: its key would be as long as the address."""
    if len(public_id) > PUBLIC_ID_MAX:
        return {}
    return cache.get_many([order_key(public_id), CHAINS_KEY])


def remember_rendering(
    *, public_id: str, token: str, rendering_id: str, versions: dict[str, str], fresh_for: float
) -> None:
    """Keep the record that lets a page showing this rendering (its poll names `rendering_id`) be answered
    "unchanged", for at most `fresh_for` seconds and `RECORD_TTL`. Call it once the link was checked: versions
    are only set for real orders."""
    missing = {order_key(public_id), CHAINS_KEY} - versions.keys()
    if missing:  # not known at render time: the rendering cannot be proven current; the next one will be
        for key in missing:
            cache.add(key, new_token(), timeout=VERSION_TTL)
        return
    timeout = int(min(RECORD_TTL, fresh_for))
    if timeout >= 1:
        cache.set(shown_key(rendering_id), [_link(public_id, token), versions], timeout=timeout)


def unchanged(*, public_id: str, token: str, rendering_id: str) -> bool:
    """Whether the block rendered as `rendering_id`, for this link, still shows what is current: one round trip
    of three small values, no query. A token deleted since then bumped the order, so it fails here too."""
    if not RENDERING_ID.fullmatch(rendering_id) or len(public_id) > PUBLIC_ID_MAX:
        return False
    found = cache.get_many([shown_key(rendering_id), order_key(public_id), CHAINS_KEY])
    shown = found.pop(shown_key(rendering_id), None)
    return shown == [_link(public_id, token), found]  # JSON: the record comes back as a list
