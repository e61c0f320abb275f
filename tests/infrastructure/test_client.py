"""The client's address behind the declared number of proxies: what the rate limits count."""

import pytest
from django.test import Client, RequestFactory
from django.urls import reverse

from infrastructure.client import client_address

PROXY = "10.0.0.2"


def _address(xff: str | None, *, remote: str = PROXY) -> str:
    meta = {"REMOTE_ADDR": remote}
    if xff is not None:
        meta["HTTP_X_FORWARDED_FOR"] = xff
    return client_address(RequestFactory().get("/", **meta))


def test_without_a_proxy_the_forwarded_header_is_ignored(settings):
    settings.TRUSTED_PROXY_COUNT = 0
    assert _address("203.0.113.7", remote="198.51.100.9") == "198.51.100.9"


@pytest.mark.parametrize(
    ("proxies", "xff", "client"),
    [
        (1, "203.0.113.7", "203.0.113.7"),
        (1, "1.2.3.4, 203.0.113.7", "203.0.113.7"),  # the client wrote 1.2.3.4 itself: ignored
        (1, "2001:db8::1", "2001:db8::1"),
        (2, "1.2.3.4, 203.0.113.7, 10.0.0.9", "203.0.113.7"),
        (1, None, PROXY),  # a proxy that did not say: its own address, never a client's choice
        (2, "203.0.113.7", PROXY),
        (1, "1.2.3.4, not-an-address", PROXY),
        (1, "203.0.113.7:51234", "203.0.113.7"),  # a balancer that writes the client's port too
        (1, "[2001:db8::1]:51234", "2001:db8::1"),
        (1, "1.2.3.4:80:90", PROXY),
    ],
)
def test_behind_proxies_the_client_is_the_entry_the_outermost_proxy_wrote(settings, proxies, xff, client):
    settings.TRUSTED_PROXY_COUNT = proxies
    assert _address(xff) == client


@pytest.mark.django_db
def test_behind_a_proxy_one_client_hitting_the_limit_does_not_block_the_others(settings, catalog):
    settings.TRUSTED_PROXY_COUNT = 1
    url = reverse("customer:resend-link")
    abuser = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="203.0.113.66")
    answers = [abuser.post(url, {"email": f"junk{index}@example.org"}).status_code for index in range(6)]
    forged = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="198.51.100.1, 203.0.113.66")  # same client, forged head
    researcher = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="198.51.100.20")

    assert answers == [200] * 5 + [429]
    assert forged.post(url, {"email": "other@example.org"}).status_code == 429
    assert researcher.post(url, {"email": "ada@example.org"}).status_code == 200
