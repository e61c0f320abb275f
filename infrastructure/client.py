"""The client's address, right behind the proxies the operator declares (TRUSTED_PROXY_COUNT).

Each proxy appends the address it received the request from to X-Forwarded-For, so behind N trusted proxies the
client is the N-th entry from the right; entries further left were written by the client and prove nothing. With
no proxy (the default), X-Forwarded-For is ignored and REMOTE_ADDR is the client. A header shorter than the proxy
count or an entry that is not an address means a proxy is missing or misconfigured: REMOTE_ADDR is used, so an
attacker cannot choose the address that is counted.
"""

import hashlib
import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest


def client_address(request: HttpRequest) -> str:
    remote = request.META.get("REMOTE_ADDR") or "0.0.0.0"  # noqa: S104 (a key for counting, never bound)
    proxies = settings.TRUSTED_PROXY_COUNT
    if proxies <= 0:
        return remote
    entries = request.META.get("HTTP_X_FORWARDED_FOR", "").rsplit(",", proxies)
    if len(entries) < proxies:
        return remote
    candidate = _without_port(entries[-proxies].strip())
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return remote


def _without_port(entry: str) -> str:
    """The address of an X-Forwarded-For entry that a proxy wrote with its port ("203.0.113.7:51234",
    "[2001:db8::1]:51234", as some load balancers do): without it, every such client would fall back to the proxy's
    own address and share one bucket of the rate limits."""
    if entry.startswith("[") and "]" in entry:
        return entry[1 : entry.index("]")]
    if entry.count(":") == 1:
        return entry.split(":", 1)[0]
    return entry


def client_key(request: HttpRequest) -> str:
    """What an order remembers of the address it was placed from: a keyed digest (the address itself is not
    kept), of the /64 for IPv6 as the rate limits count it. Only compared for equality."""
    address = ipaddress.ip_address(client_address(request))
    if address.version == 6:
        address = ipaddress.ip_network(f"{address}/64", strict=False).network_address
    return hmac.new(settings.SECRET_KEY.encode(), f"client:{address}".encode(), hashlib.sha256).hexdigest()
