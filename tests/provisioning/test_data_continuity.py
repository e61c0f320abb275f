"""Data continuity, tried as a researcher who validates a split on a 3-day window and goes on to a campaign: the data
volume of order 1 is carried to order 2 on the same host (opted in from order 1's link), so the campaign starts from
the checkpoints of the trial. Against the real sshd on loopback and podman with runc (tests/provisioning/conftest)."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse

from booking.models import OrderStatus
from booking.services import order_end_early
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning import rules, runs, services
from provisioning.models import Access, ProvisioningRun
from tests.booking.test_pages import order_url, place
from tests.provisioning.conftest import customer_ssh, remove_user
from tests.provisioning.test_container_access import _hand_over, _in

pytestmark = pytest.mark.django_db


def _text(response) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", response.content.decode()).split())


def _book_again_form(client, order, token) -> dict:
    """The hidden fields of the booking page opened from the order's "book again with my data" link."""
    page = client.get(reverse("booking:order-book-again", kwargs={"public_id": order.public_id, "token": token}))
    assert page.status_code == 200 and page["Referrer-Policy"] == "same-origin"
    fields = dict(
        re.findall(r'<input type="hidden" name="(carry_from|carry_token)" value="([^"]*)"', page.content.decode())
    )
    assert fields == {"carry_from": order.public_id, "carry_token": token}
    assert 'name="carry_data"' in page.content.decode() and "checked" in page.content.decode()
    return fields


def _approve_and_provision(order, admin_user, callbacks):
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    services.order_approve(order=order, actor=admin_user)
    with callbacks(execute=True):
        run = runs.provisioning_start(order=order, actor=admin_user)
    run.refresh_from_db()
    assert run.error.startswith("preflight") or not run.error, run.error  # no GPU here: only the pre-flight fails
    return _hand_over(order, admin_user, callbacks)


def test_data_written_in_order_1_is_in_order_2_on_the_same_host(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, start_date,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    callbacks = django_capture_on_commit_callbacks
    private_key, public_key = keypair("ada")
    made = []
    try:
        # given: order 1, handed over; the researcher leaves checkpoints (one private to them) and a link in ~
        order1, token1 = place(client, booking_data(lots="1", days="3", ssh_keys=public_key))
        made.append(rules.username_for(order1))
        access1 = _approve_and_provision(order1, admin_user, callbacks)
        write = (
            "mkdir -p ~/ckpt && echo step-1200 > ~/ckpt/latest && chmod 600 ~/ckpt/latest && chmod 700 ~/ckpt "
            "&& ln -s /etc/shadow ~/ckpt/shadow-link && echo written"
        )
        assert _in(access1, private_key, write).stdout.strip() == "written"
        assert "Book again with my data" in _text(client.get(order_url(order1, token1)))

        # when: the window ends (early: the stop criterion was met), and order 2 is booked from order 1's link
        with callbacks(execute=True):
            order_end_early(order=order1)
        order1.refresh_from_db()
        assert order1.status == OrderStatus.ENDED
        assert order1.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN).status == "succeeded"
        carry = _book_again_form(client, order1, token1)
        later = (start_date + timedelta(days=10)).isoformat()
        order2, token2 = place(
            client, booking_data(lots="1", days="7", start_date=later, ssh_keys=public_key, carry_data="on", **carry)
        )
        made.append(rules.username_for(order2))
        assert order2.carry_data_from == order1
        assert order2.allocations.get().lot.host == container_host
        assert "Carried from order " + order1.public_id in _text(client.get(order_url(order2, token2)))
        access2 = _approve_and_provision(order2, admin_user, callbacks)

        # then: order 2 logs in to its own account and finds order 1's files, its own now, private ones included
        assert access2.username != access1.username
        found = _in(access2, private_key, "cat ~/ckpt/latest && stat -c %U ~/ckpt/latest ~/ckpt ~ && touch ~/ckpt/new")
        assert found.stdout.split() == ["step-1200", access2.username, access2.username, access2.username]
        # the link was re-owned, never followed: the host's /etc/shadow is still root's
        assert admin.run(["stat", "-c", "%U", "/etc/shadow"]).stdout.strip() == "root"
        assert (
            "carried from " + access1.username
            in order2.provisioning_runs.get(kind="provision").steps.get(name="prepare_data").output
        )
        assert access2.disk_gib == access1.disk_gib == 1
        # the volume left order 1 entirely: its file is gone from root's directory, its key reaches nothing of it
        assert not admin.run(["test", "-e", f"/var/lib/binome-volumes/{access1.username}.ext4"], check=False).ok
        assert customer_ssh(access1, private_key, "cat ~/ckpt/latest").returncode != 0

        # and: order 1's page says where its data went, and offers it no more
        page = _text(client.get(order_url(order1, token1)))
        assert f"Your data volume is carried to order {order2.public_id}" in page
        assert "Book again with my data" not in page

        # and: order 1's wipe deletes its account, not the volume that moved to order 2
        with callbacks(execute=True):
            runs.access_wipe_start(order=order1, actor=admin_user)
        assert order1.provisioning_runs.get(kind=ProvisioningRun.Kind.WIPE).status == "succeeded"
        assert not admin.run(["id", access1.username], check=False).ok
        assert _in(access2, private_key, "cat ~/ckpt/latest").stdout.strip() == "step-1200"
        assert Access.objects.get(pk=access1.pk).wiped_at is not None
    finally:
        for username in made:
            remove_user(admin, username)
