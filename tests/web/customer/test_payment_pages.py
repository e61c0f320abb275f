"""The order page's payment actions, the admin review, and the custody rules of the settings."""

import html
import os
import subprocess
import sys

import pytest
from django.urls import reverse

from booking.models import OrderStatus
from payments import config, scanner
from payments.addresses import DEMO_ACCOUNT_XPUB, deposit_address
from payments.demo import pay_invoice
from payments.models import Invoice
from payments.selectors import current_invoice
from tests.builders.broker import broker_down
from tests.builders.orders import place

CHAIN_ID = 31337


def urls(order, token) -> dict:
    kwargs = {"public_id": order.public_id, "token": token}
    return {name: reverse(f"customer:{name}", kwargs=kwargs) for name in ("order", "order-paid", "order-asset")}


def test_ive_paid_records_the_click_and_a_check_finds_the_transfer(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    receipt_hash = pay_invoice(chain, invoice)
    chain.mine(2)

    response = client.post(urls(order, token)["order-paid"], {"tx_hint": receipt_hash})

    assert response.status_code == 302
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.customer_paid_at is not None and invoice.customer_tx_hint == receipt_hash.lower()
    assert invoice.status == Invoice.Status.SETTLED  # the eager check scanned the chain
    assert order.status == OrderStatus.PAID
    assert any(event.reason == "customer says they paid" for event in order.events.all())


def test_ive_paid_with_the_broker_down_keeps_the_click_and_says_the_check_is_delayed(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    with broker_down():
        response = client.post(urls(order, token)["order-paid"], {"tx_hint": ""})

    assert response.status_code == 302
    invoice.refresh_from_db()
    assert invoice.customer_paid_at is not None and invoice.check_delayed_since is not None
    page = html.unescape(client.get(urls(order, token)["order"]).content.decode())
    assert "Check delayed" in page and "You told us you paid" in page

    # Once the broker is back, beat's scan finds the payment without another click.
    pay_invoice(chain, invoice)
    chain.mine(2)
    scanner.chain_scan(chain_id=CHAIN_ID)
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and invoice.check_delayed_since is None


@pytest.mark.parametrize("hint", ["0x1234", "not a hash", "<script>", "0x" + "g" * 64])
def test_a_malformed_transaction_hash_is_refused_politely(client, chain, booking_data, hint):
    order, token = place(client, booking_data(lots="1"))

    response = client.post(urls(order, token)["order-paid"], {"tx_hint": hint}, follow=True)

    assert response.status_code == 200
    assert "A transaction hash is 0x followed by 64 hexadecimal characters" in html.unescape(response.content.decode())
    assert current_invoice(order).customer_paid_at is None


def test_ive_paid_answers_the_live_block_to_htmx(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    response = client.post(urls(order, token)["order-paid"], {"tx_hint": ""}, headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert response.content.decode().lstrip().startswith('<section class="panel order-status"')


def test_changing_the_asset_replaces_the_quote_and_the_address(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    first = current_invoice(order)

    client.post(urls(order, token)["order-asset"], {"asset": f"{CHAIN_ID}:dUSDT"})

    second = current_invoice(order)
    first.refresh_from_db()
    assert second.asset_symbol == "dUSDT" and second.deposit_address != first.deposit_address
    assert first.status == Invoice.Status.INVALID
    page = client.get(urls(order, token)["order"]).content.decode()
    assert second.deposit_address.lower() in page.lower() and first.deposit_address.lower() not in page.lower()


@pytest.mark.parametrize("asset", ["", "31337:DOGE", "1:dEURC", "abc:def", "31337:" + "X" * 500])
def test_an_unknown_asset_is_refused_and_the_invoice_kept(client, chain, booking_data, asset):
    order, token = place(client, booking_data(lots="1"))
    before = current_invoice(order)

    response = client.post(urls(order, token)["order-asset"], {"asset": asset}, follow=True)

    assert response.status_code == 200
    assert "Choose one of the payment methods listed." in html.unescape(response.content.decode())
    assert current_invoice(order) == before


def test_the_asset_cannot_change_once_a_transfer_was_seen(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    pay_invoice(chain, current_invoice(order))
    scanner.chain_scan(chain_id=CHAIN_ID)

    response = client.post(urls(order, token)["order-asset"], {"asset": f"{CHAIN_ID}:ETH"}, follow=True)

    assert "can no longer be changed" in html.unescape(response.content.decode())
    assert current_invoice(order).asset_symbol == "dEURC"


def test_payment_actions_need_the_order_token(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    wrong = {name: url.replace(token, "x" * 43) for name, url in urls(order, token).items()}
    assert client.post(wrong["order-paid"]).status_code == 404
    assert client.post(wrong["order-asset"], {"asset": f"{CHAIN_ID}:ETH"}).status_code == 404
    assert client.get(urls(order, token)["order-paid"]).status_code == 405


def test_an_admin_marks_an_invoice_paid_with_a_reason_and_it_is_audited(client, chain, booking_data, admin_user):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    client.force_login(admin_user)
    changelist = reverse("admin:payments_invoice_changelist")

    without_reason = client.post(changelist, {"action": "mark_paid", "_selected_action": [invoice.pk], "reason": ""})
    assert without_reason.status_code == 200 and "This field is required." in without_reason.content.decode()
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.NEW

    client.post(changelist, {"action": "mark_paid", "_selected_action": [invoice.pk], "reason": "paid by bank wire"})

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and invoice.marked and invoice.marked_by == admin_user
    assert order.status == OrderStatus.PAID
    event = order.events.last()
    assert (event.actor_kind, event.actor, event.reason) == ("admin", admin_user, "marked paid: paid by bank wire")
    from django.contrib.admin.models import LogEntry

    assert LogEntry.objects.filter(object_id=str(invoice.pk), change_message__contains="bank wire").exists()


def test_admins_filter_pending_payments_and_recheck_on_chain(client, chain, booking_data, admin_user):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice, units=10_000000)
    chain.mine(2)
    client.force_login(admin_user)
    changelist = reverse("admin:payments_invoice_changelist")

    client.post(changelist, {"action": "recheck_on_chain", "_selected_action": [invoice.pk]})

    invoice.refresh_from_db()
    assert invoice.paid_partial
    partial = client.get(changelist + "?exception=partial").content.decode()
    assert order.public_id in partial
    assert client.get(changelist + "?exception=over").content.decode().count(order.public_id) == 0
    detail = client.get(reverse("admin:payments_invoice_change", args=[invoice.pk])).content.decode()
    assert invoice.transfers.get().tx_hash in detail


def test_deposit_addresses_come_from_the_xpub_and_are_never_reused(client, chain, booking_data, settings):
    first, _ = place(client, booking_data(lots="1"))
    second, _ = place(client, booking_data(lots="1", contact_email="b@example.org"))
    a, b = current_invoice(first), current_invoice(second)

    assert a.deposit_address != b.deposit_address
    assert a.deposit_address == deposit_address(config.account_xpub(), a.derivation_index).lower()
    assert b.derivation_index > a.derivation_index


def _in_production(*argv: str, **env) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in ("DEBUG", "PAYMENTS_XPUB")}
    environment.update(
        {
            "DEBUG": "0",
            "SECRET_KEY": "s" * 64,
            "SITE_URL": "https://book.example.org",
            "ALLOWED_HOSTS": "book.example.org",
            "EMAIL_URL": "smtp+tls://binome:s3cret@mail.example.org:587",
            "DEFAULT_FROM_EMAIL": "Binôme <bookings@book.example.org>",
            "PAYMENTS_CHAINS_FILE": "payments/chains.demo.toml",
            **env,
        }
    )
    return subprocess.run(
        [sys.executable, *argv],
        env={**environment, "DJANGO_SETTINGS_MODULE": "portal.settings"},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_settings_name_the_payment_secrets_and_the_checks_refuse_the_demo_xpub_and_any_private_key():
    """The settings read the environment only: a command that needs no chain starts without the xpub. The checks
    every process runs before it starts (`manage.py check`; bin/web, bin/worker, bin/beat) refuse it."""
    read_settings = (
        "import sys, django\n"
        "from django.conf import settings\n"
        "settings.INSTALLED_APPS\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in ('payments', 'bip_utils')))\n"
        "django.setup()\n"
    )
    loaded = _in_production("-c", read_settings)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stderr[-2000:]

    demo = _in_production("manage.py", "check", PAYMENTS_XPUB=DEMO_ACCOUNT_XPUB)
    assert demo.returncode != 0 and "(payments.E006) PAYMENTS_XPUB is the demo key" in demo.stderr

    xprv = (
        "xprv9s21ZrQH143K3QTDL4LXw2F7HEK3wJUD2nW2nRk4stbPy6cq3jPPqjiChkVvvNKmPGJxWUtg6LnF5kejMRNNU3TGtRBeJgk33yuGBx"
        "rMPHi"
    )
    private = _in_production("manage.py", "check", PAYMENTS_XPUB=xprv)
    assert private.returncode != 0 and "(payments.E007) PAYMENTS_XPUB: This is a private extended key" in private.stderr

    missing = _in_production("manage.py", "check")
    assert missing.returncode != 0 and "(payments.E007) PAYMENTS_XPUB" in missing.stderr


def test_the_polled_status_block_follows_every_scan_of_the_chain(
    client, chain, booking_data, settings, tmp_path, django_capture_on_commit_callbacks
):
    import re

    from payments.chain import ChainUnavailable
    from tests.payments.conftest import chains_toml, free_port

    order, token = place(client, booking_data(lots="1"))

    def poll() -> str:
        return client.get(urls(order, token)["order"], headers={"HX-Request": "true"}).content.decode()

    def scan() -> None:
        with django_capture_on_commit_callbacks(execute=True):
            scanner.chain_scan(chain_id=CHAIN_ID)

    assert "Waiting for your transfer." in poll()
    assert "Waiting for your transfer." in poll()  # from the cache now

    pay_invoice(chain, current_invoice(order))
    scan()
    seen = int(re.search(r"(\d)/3 confirmations", poll()).group(1))

    chain.mine(1)  # confirmations come from the chain's head, which only the scan reads
    scan()
    assert f"{seen + 1}/3 confirmations" in poll()

    path = tmp_path / "dead.toml"
    path.write_text(chains_toml(f"http://127.0.0.1:{free_port()}"))
    settings.PAYMENTS_CHAINS_FILE = str(path)
    with pytest.raises(ChainUnavailable):
        scan()
    assert "Check delayed: the network is not answering" in poll()
