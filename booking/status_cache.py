"""A shared cache of the order page's live status block (`booking/order.html#order-status`), which every open
order page polls with htmx every few seconds.

An entry is the rendered block of one order, for one secret link and one language, stored with the versions of
what it shows at render time:

- the order's version (`order_key`, by order number), replaced on commit by every write to the order, its
  events, its invoices and their transfers, its accesses and its links: model saves and deletes through the
  signals of `booking/apps.py`, queryset `.update()` calls by the services that make them (`bump_orders`);
- the chains' version (`CHAINS_KEY`), replaced when a chain becomes unreachable or answers again ("check
  delayed" depends on the chain's cursor, not only on the invoice).

An entry whose versions differ from the current ones is never served. Versions are random, so a value evicted
and set again cannot match an older entry. Entries also expire after `ENTRY_TTL` seconds, and sooner when the
block's text depends on the time (the warning before the end of an active window): they never outlive it.

A hit costs one cache round trip (the entry and the versions, fetched together) and no query: the entry is
found by the order number and the hash of the secret token, so only a link the database accepted when the
entry was rendered can reach it (tokens are never edited; deleting one bumps the order). The CSRF token is
rendered as a placeholder and replaced per response.

Each rendering has an id, written into the block's own poll URL (`?v=`), and a small record under that id: the
link it was rendered for (order number and token hash) and its versions. A page that already shows a block polls
with its id and, while that record's versions are the current ones, gets "204 No Content" (htmx leaves the block
as it is): no body, no token. `booking.middleware.UnchangedStatusMiddleware` answers those polls before sessions,
locale, CSRF, authentication and messages run, which the answer needs none of.
"""

import re
import secrets
from dataclasses import dataclass

from django.core.cache import cache
from django.db import transaction

from booking.tokens import token_hash

ENTRY_TTL = 30
VERSION_TTL = 24 * 3600  # longer than any entry; a version that expired is set again at random
CHAINS_KEY = "order-status:chains:version"
RENDERING_ID = re.compile(r"[0-9a-f]{16}")  # what `new_token` makes: anything else names no rendering


def order_key(public_id: str) -> str:
    return f"order-status:order:{public_id}:version"


def entry_key(*, public_id: str, token: str, language: str) -> str:
    return f"order-status:entry:{public_id}:{token_hash(token)}:{language}"


def shown_key(rendering_id: str) -> str:
    return f"order-status:shown:{rendering_id}"


def _link(public_id: str, token: str) -> str:
    return f"{public_id}:{token_hash(token)}"


@dataclass(frozen=True)
class Entry:
    versions: dict[str, str]
    body: bytes
    stop_polling: bool


def new_token() -> str:
    """A fresh random value: an order's or the chains' version, an entry's id."""
    return secrets.token_hex(8)


def bump_orders(*order_ids: int | None) -> None:
    """Invalidate the cached status blocks of these orders, once the current transaction (if any) commits."""
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
    """Invalidate every cached status block that may show a chain's availability, on commit."""
    transaction.on_commit(lambda: cache.set(CHAINS_KEY, new_token(), timeout=VERSION_TTL))


def current_versions(public_id: str) -> dict[str, str]:
    """The versions an entry is rendered at: read *before* the rendering reads the database, so that a write
    committed meanwhile leaves the entry older than the version its bump sets."""
    keys = [order_key(public_id), CHAINS_KEY]
    versions = cache.get_many(keys)
    for key in keys:
        if key not in versions:
            version = new_token()
            versions[key] = version if cache.add(key, version, timeout=VERSION_TTL) else cache.get(key)
    return versions


def lookup(key: str, *, public_id: str) -> Entry | None:
    """The entry under `key`, if its versions are still the current ones."""
    found = cache.get_many([key, order_key(public_id), CHAINS_KEY])
    entry = found.pop(key, None)
    if not isinstance(entry, Entry) or found != entry.versions:
        return None
    return entry


def store(key: str, entry: Entry, *, public_id: str, token: str, rendering_id: str, fresh_for: float) -> None:
    """Keep a rendered block (with the CSRF placeholder) for at most `fresh_for` seconds and `ENTRY_TTL`, and the
    record that lets a page showing it (its poll names `rendering_id`) be answered "unchanged"."""
    timeout = int(min(ENTRY_TTL, fresh_for))
    if timeout >= 1 and None not in entry.versions.values():
        shown = (_link(public_id, token), entry.versions)
        cache.set_many({key: entry, shown_key(rendering_id): shown}, timeout=timeout)


def unchanged(*, public_id: str, token: str, rendering_id: str) -> bool:
    """Whether the block rendered as `rendering_id`, for this link, still shows what is current: one round trip
    of three small values, no query. A token deleted since then bumped the order, so it fails here too."""
    if not RENDERING_ID.fullmatch(rendering_id):
        return False
    found = cache.get_many([shown_key(rendering_id), order_key(public_id), CHAINS_KEY])
    shown = found.pop(shown_key(rendering_id), None)
    return shown == (_link(public_id, token), found)
