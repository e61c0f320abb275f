"""Security as users and attackers meet it: headers, CSRF on every state-changing request, who may reach what,
and production settings that refuse unsafe defaults."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from booking.models import Order, OrderStatus
from tests.booking.test_pages import place

ROOT = Path(__file__).resolve().parents[2]
NOT_DEMO_XPUB = (  # BIP-32 test vector 1, chain m/0H/1/2H: a valid depth-3 public key that is not the demo's
    "xpub6D4BDPcP2GT577Vvch3R8wDkScZWzQzMMUm3PWbmWvVJrZwQY4VUNgqFJPMM3No2dFDFGTsxxpG5uJh7n7epu4trkrX7x7DogT5Uv6fcLW5"
)


@pytest.mark.django_db
def test_customer_pages_carry_a_strict_content_security_policy_and_no_inline_script(client, catalog, booking_data):
    order, token = place(client, booking_data())
    pages = [
        reverse("booking:book"),
        reverse("booking:guide"),
        reverse("booking:fit"),
        reverse("booking:resend-link"),
        reverse("booking:order", kwargs={"public_id": order.public_id, "token": token}),
    ]
    for url in pages:
        response = client.get(url)
        policy = response["Content-Security-Policy"]
        assert "script-src 'self';" in policy and "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
        assert response["X-Frame-Options"] == "DENY" and response["X-Content-Type-Options"] == "nosniff"
        inline = re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", response.content.decode())
        assert inline == [], (url, inline)
        handlers = re.findall(r"<[a-zA-Z][^>]*\son[a-z]+=", response.content.decode())
        assert handlers == [], (url, handlers)  # no inline event handler either


def _role_clients(django_user_model) -> dict[str, Client]:
    clients = {"anonymous": Client()}
    staff = django_user_model.objects.create_user("sam", password="a-long-staff-password", is_staff=True)
    operator = django_user_model.objects.create_user("olga", password="a-long-operator-password", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="operate_orders"))
    admin = django_user_model.objects.create_superuser("ada", "ada@example.org", "a-long-admin-password")
    for name, user in (("staff", staff), ("operator", operator), ("admin", admin)):
        clients[name] = Client()
        clients[name].force_login(user)
    return clients


@pytest.mark.django_db
def test_the_permission_matrix(client, catalog, booking_data, django_user_model):
    order, token = place(client, booking_data())
    clients = _role_clients(django_user_model)
    right = {"public_id": order.public_id, "token": token}
    wrong = {"public_id": order.public_id, "token": "w" * 43}
    console = reverse("console:queue")
    console_order = reverse("console:order", kwargs={"public_id": order.public_id})
    approve = reverse("console:action", kwargs={"public_id": order.public_id, "action": "approve"})
    admin_orders = reverse("admin:booking_order_changelist")

    # Customer pages: the secret link is the only key, whoever holds it.
    for role, role_client in clients.items():
        assert role_client.get(reverse("booking:order", kwargs=right)).status_code == 200, role
        assert role_client.get(reverse("booking:order", kwargs=wrong)).status_code == 404, role
        for name in ("order-cancel", "order-paid", "order-asset", "order-split-trial"):
            assert role_client.post(reverse(f"booking:{name}", kwargs=wrong)).status_code == 404, (role, name)

    expected = {  # role: (console GET, console order GET, approve POST, admin changelist GET)
        "anonymous": (302, 302, 302, 302),
        "staff": (403, 403, 403, 403),
        "operator": (200, 200, 302, 403),
        "admin": (200, 200, 302, 200),
    }
    for role, (queue_status, order_status, approve_status, admin_status) in expected.items():
        role_client = clients[role]
        assert role_client.get(console).status_code == queue_status, role
        assert role_client.get(console_order).status_code == order_status, role
        if role in ("anonymous", "staff"):
            assert role_client.post(approve).status_code == approve_status, role
        assert role_client.get(admin_orders).status_code == admin_status, role
    order.refresh_from_db()
    assert order.status == OrderStatus.AWAITING_PAYMENT  # nobody above could approve an unpaid order


@pytest.mark.django_db
def test_every_state_changing_request_needs_its_csrf_token(catalog, booking_data, django_user_model):
    order, token = place(Client(), booking_data())
    browser = Client(enforce_csrf_checks=True)
    kwargs = {"public_id": order.public_id, "token": token}
    posts = [
        (reverse("booking:book"), booking_data()),
        (reverse("booking:order-cancel", kwargs=kwargs), {}),
        (reverse("booking:order-paid", kwargs=kwargs), {}),
        (reverse("booking:order-asset", kwargs=kwargs), {"asset": "31337:dUSDT"}),
        (reverse("booking:order-split-trial", kwargs=kwargs), {}),
        (reverse("booking:resend-link"), {"email": "ada@example.org"}),
        (reverse("set_language"), {"language": "fr"}),
    ]
    for url, data in posts:
        assert browser.post(url, data).status_code == 403, url
    operator = django_user_model.objects.create_superuser("ada", "ada@example.org", "a-long-admin-password")
    browser.force_login(operator)
    action = reverse("console:action", kwargs={"public_id": order.public_id, "action": "cancel"})
    assert browser.post(action).status_code == 403
    order.refresh_from_db()
    assert order.status == OrderStatus.AWAITING_PAYMENT and Order.objects.count() == 1


def _production(*args: str, **env: str) -> subprocess.CompletedProcess:
    # A production environment: none of the development or test switches (the browser tests set
    # DJANGO_ALLOW_ASYNC_UNSAFE for Playwright in this process).
    dropped = ("DEBUG", "SECRET_KEY", "PAYMENTS_XPUB", "DJANGO_ALLOW_ASYNC_UNSAFE")
    environment = {key: value for key, value in os.environ.items() if key not in dropped}
    environment.update({"DEBUG": "0", "PAYMENTS_CHAINS_FILE": str(ROOT / "payments" / "chains.demo.toml"), **env})
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environment, capture_output=True, text=True, check=False
    )


def test_check_deploy_is_clean_with_production_settings():
    result = _production(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        SECRET_KEY="p" * 20 + "roduction-" + "k" * 40,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        ALLOWED_HOSTS="book.example.org",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_to_start_with_the_default_secret_key():
    result = _production("check", PAYMENTS_XPUB=NOT_DEMO_XPUB)
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr
