"""What production refuses in the addresses it is given: the base of the links it mails, the hosts it serves, the
mail backend and the sender.

Pure functions of their arguments, called by portal/settings.py when DEBUG is off: a refusal stops every process
(web, worker, beat, manage.py) at start with its reason (docs/operations.md, "Site address and e-mail").
"""

import ipaddress
from email.utils import parseaddr
from urllib.parse import urlsplit

# Domains reserved never to be anyone's (RFC 2606, RFC 6761): mail from them is refused or junked by the servers
# that check the sender's domain (SPF, DMARC, reject_unknown_sender_domain).
RESERVED_SENDER_DOMAINS = ("invalid", "test", "example", "localhost")

# The development backends of django-environ's EMAIL_URL schemes, and why production cannot use them.
DEVELOPMENT_EMAIL_BACKENDS = {
    "django.core.mail.backends.console.EmailBackend": (
        "consolemail:// prints every e-mail, secret order links included, to the worker's output, past the log "
        "redaction"
    ),
    "django.core.mail.backends.filebased.EmailBackend": (
        "filemail:// writes every e-mail, secret order links included, to files on the worker's disk"
    ),
    "django.core.mail.backends.locmem.EmailBackend": "memorymail:// keeps e-mails in memory: no customer gets one",
    "django.core.mail.backends.dummy.EmailBackend": "dummymail:// drops every e-mail: no customer gets one",
}


def email_backend_refusal(backend: str) -> str | None:
    """Why production cannot send its e-mails through `backend`, or None."""
    return DEVELOPMENT_EMAIL_BACKENDS.get(backend)


def sender_refusal(sender: str) -> str | None:
    """Why mail sent from `sender` ("Name <address>" or a bare address) would not reach customers, or None."""
    _name, address = parseaddr(sender)
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain:
        return "it is not an e-mail address"
    domain = domain.rstrip(".").lower()
    if domain.rsplit(".", 1)[-1] in RESERVED_SENDER_DOMAINS:
        return f"{domain} is a reserved domain that never resolves: receiving servers refuse or junk mail sent from it"
    return None


def site_url_host_refusal(url: str, allowed_hosts: list[str]) -> str | None:
    """Why the host of `url` would be answered "400 Bad Request" (DisallowedHost) by these ALLOWED_HOSTS, or None."""
    from django.http.request import validate_host  # imported when called: this module is read by the settings

    host = (urlsplit(url).hostname or "").rstrip(".")
    if ":" in host:  # an IPv6 address, written in brackets in ALLOWED_HOSTS as in a Host header
        host = f"[{host}]"
    if validate_host(host, allowed_hosts):
        return None
    return f"its host {host!r} is not in ALLOWED_HOSTS {','.join(allowed_hosts)!r}: every mailed link would be refused"


def site_url_refusal(url: str, *, private_network: bool) -> str | None:
    """Why links built on `url` would not reach customers, or would carry their secret in clear; None if they work.

    `private_network` is the operator saying that the portal is only reached inside the lab's own network (a VPN,
    an SSH tunnel): there, plain http and internal or loopback addresses are what customers use."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number or out of range)
    except ValueError:
        return "it is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "it must be an absolute address such as https://book.example.org"
    if parts.username is not None or parts.query or parts.fragment:
        return "it must hold no user name, password, query or fragment"
    host = parts.hostname.rstrip(".")
    address = _ip_address(host)
    if address is not None and address.is_unspecified:
        return "0.0.0.0 and :: are listening addresses, not addresses a browser can open"
    if private_network:
        return None
    if host == "localhost" or host.endswith(".localhost") or (address is not None and address.is_loopback):
        return "a loopback address: each customer's browser would open their own machine"
    if address is not None and not address.is_global:
        return "a private address: only its own network reaches it"
    if parts.scheme != "https":
        return "plain http: every mailed link would carry its order's secret in clear"
    return None


def served_over_https(url: str) -> bool:
    """Whether customers open `url` over https (`HTTPS://` too: urlsplit lowercases the scheme)."""
    return urlsplit(url).scheme == "https"


def _ip_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
