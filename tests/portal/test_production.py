"""portal/production.py: which site addresses and mail backends production refuses, and why (the settings' use of
it, in real processes, is in tests/portal/test_security.py; a lab on plain http in Chromium, in
tests/browser/test_private_network.py)."""

import pytest

from portal.production import (
    DEVELOPMENT_EMAIL_BACKENDS,
    email_backend_refusal,
    sender_refusal,
    served_over_https,
    site_url_host_refusal,
    site_url_refusal,
)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:8000", "loopback"),  # the development default
        ("https://localhost", "loopback"),
        ("https://portal.localhost:8443", "loopback"),
        ("https://127.8.9.10", "loopback"),
        ("https://[::1]:8443", "loopback"),
        ("https://10.8.0.1", "private address"),
        ("https://192.168.1.20:8443", "private address"),
        ("https://100.101.102.103", "private address"),  # shared address space (a Tailscale network, CGNAT)
        ("https://[fd00::5]", "private address"),
        ("https://169.254.1.1", "private address"),
        ("http://book.example.org", "plain http"),
        ("http://203.0.113.7", "private address"),  # TEST-NET-3: not a global address either
        ("http://0.0.0.0:8000", "listening addresses"),
        ("book.example.org", "absolute address"),
        ("ftp://book.example.org", "absolute address"),
        ("https://", "absolute address"),
        ("https://book.example.org:99999", "not a URL"),
        ("https://user:secret@book.example.org", "no user name"),
        ("https://book.example.org/?next=x", "no user name"),
    ],
)
def test_production_refuses_a_site_address_customers_cannot_use_safely(url, reason):
    assert reason in (site_url_refusal(url, private_network=False) or "")


@pytest.mark.parametrize("url", ["https://book.example.org", "https://book.example.org/portal", "https://8.8.8.8"])
def test_a_public_https_address_is_accepted(url):
    assert site_url_refusal(url, private_network=False) is None


@pytest.mark.parametrize(
    "url", ["http://10.8.0.1:8000", "http://portal.lab.internal", "https://192.168.1.20", "http://127.0.0.1:8000"]
)
def test_a_lab_on_its_own_network_may_use_plain_http_and_internal_addresses(url):
    assert site_url_refusal(url, private_network=True) is None


@pytest.mark.parametrize("url", ["http://0.0.0.0:8000", "https://[::]", "portal.lab", "https://a:b@portal.lab"])
def test_the_private_network_switch_still_refuses_what_no_browser_can_open(url):
    assert site_url_refusal(url, private_network=True)


@pytest.mark.parametrize("backend", list(DEVELOPMENT_EMAIL_BACKENDS))
def test_production_refuses_every_development_mail_backend(backend):
    assert email_backend_refusal(backend)


def test_smtp_is_accepted():
    assert email_backend_refusal("django.core.mail.backends.smtp.EmailBackend") is None


@pytest.mark.parametrize(
    ("url", "https"),
    [("https://book.example.org", True), ("HTTPS://Book.Example.org", True), ("http://10.8.0.1:8000", False)],
)
def test_the_https_only_settings_follow_the_scheme_however_it_is_written(url, https):
    assert served_over_https(url) is https


@pytest.mark.parametrize(
    ("cache", "broker", "warned"),
    [
        ("redis://:pw@redis:6379/0", "redis://:pw@redis:6379/0", True),  # one URL for both, as before
        ("redis://:pw@redis:6379/0", "redis://:pw@redis/1", True),  # another database of the same server
        ("redis://:pw@cache:6379/0", "redis://:pw@broker:6379/0", False),  # docker-compose.yml
        ("redis://:pw@127.0.0.1:6379/0", "redis://:pw@127.0.0.1:6380/0", False),
    ],
)
def test_check_deploy_warns_when_the_cache_and_the_broker_share_a_redis_server(settings, cache, broker, warned):
    from django.core.checks import run_checks

    settings.REDIS_URL, settings.CELERY_BROKER_URL = cache, broker
    found = [message.id for message in run_checks(include_deployment_checks=True, tags=["portal"])]
    assert ("portal.W001" in found) is warned


@pytest.mark.parametrize(
    "sender",
    [
        "Binôme <bookings@binome.invalid>",  # the development default
        "bookings@portal.example",
        "bookings@lab.test",
        "Binôme <bookings@binome.localhost>",
        "bookings@localhost",
        "BOOKINGS@BINOME.INVALID.",
        "not an address",
    ],
)
def test_production_refuses_a_sender_in_a_reserved_domain(sender):
    assert sender_refusal(sender)


@pytest.mark.parametrize("sender", ["Binôme <bookings@book.example.org>", "bookings@lab.univ-paris.fr"])
def test_a_sender_of_a_real_domain_is_accepted(sender):
    assert sender_refusal(sender) is None


@pytest.mark.parametrize(
    ("url", "allowed_hosts"),
    [
        ("https://book.example.org", ["book.example.org"]),
        ("https://book.example.org:8443/", [".example.org"]),
        ("https://BOOK.example.org.", ["book.example.org"]),
        ("http://[fd00::5]:8000", ["[fd00::5]"]),
        ("https://book.example.org", ["*"]),
    ],
)
def test_a_site_url_its_allowed_hosts_serve_is_accepted(url, allowed_hosts):
    assert site_url_host_refusal(url, allowed_hosts) is None


@pytest.mark.parametrize(
    ("url", "allowed_hosts"),
    [
        ("https://book.example.org", ["localhost", "127.0.0.1"]),  # docker-compose.yml's former default
        ("https://book.example.org", []),
        ("http://[fd00::5]:8000", ["fd00::5"]),
    ],
)
def test_a_site_url_its_allowed_hosts_do_not_serve_is_refused(url, allowed_hosts):
    assert "ALLOWED_HOSTS" in site_url_host_refusal(url, allowed_hosts)
