"""A researcher's journey in the browser, in English and in French."""

import re

import pytest

from booking.models import Order, OrderStatus
from tests.factories import make_ssh_key

pytestmark = pytest.mark.integration


def fill_booking(page, *, lots: str, email: str) -> None:
    page.fill("input[name=lots]", lots)
    page.check("input[name=days][value='7']")
    page.fill("input[name=contact_name]", "Ada Lovelace")
    page.fill("input[name=contact_email]", email)
    page.fill("input[name=organisation]", "Analytical Engines Lab")
    page.fill("textarea[name=ssh_keys]", make_ssh_key())
    page.check("input[name=hypothesis][value='make_possible']")


def test_a_researcher_books_pays_on_chain_and_watches_the_order_become_paid(
    page, live_server, live_chain, catalog, worker_and_beat
):
    chain, _path = live_chain
    page.goto(live_server.url + "/")
    assert "NVIDIA B200 pair" in page.inner_text("#quote") and "6 / 6" in page.inner_text("#quote")

    # The fit advisor answers live as the researcher types.
    page.fill("input[name=fit-parameters_billion]", "13")  # 13B mixed-precision AdamW: 208 GB of states
    page.locator("#fit-advice").get_by_text("The B200 pair with sharding").wait_for(timeout=15000)

    fill_booking(page, lots="2", email="ada@example.org")
    page.click("text=Place the order and hold the lots")
    page.wait_for_url(re.compile(r".*/orders/BN-[^/]+/[^/]+/$"))
    assert "Awaiting payment" in page.inner_text("#order-status")

    # Pay as a wallet would: what the EIP-681 link says, to whom it says.
    uri = page.get_attribute("a[href^='ethereum:']", "href")
    match = re.fullmatch(r"ethereum:(0x[0-9a-fA-F]{40})@31337/transfer\?address=(0x[0-9a-fA-F]{40})&uint256=(\d+)", uri)
    token, to, units = match.group(1).lower(), match.group(2), int(match.group(3))
    payer = chain.accounts()[4]
    chain.mint(token, payer, units, sender=payer)
    receipt = chain.send_token(token, to, units, sender=payer)
    page.fill("input[name=tx_hint]", receipt["transactionHash"])
    page.click("text=I've paid")

    page.locator("#order-status").get_by_text("confirmations").wait_for(timeout=30000)
    chain.mine(2)
    page.locator("#order-status").get_by_text("Paid: 6300.00 dEURC received and confirmed.").wait_for(timeout=30000)
    order = Order.objects.get()
    assert order.status == OrderStatus.PAID
    assert order.fit_advice["recommendation"] == "b200_pair_sharded"


def test_une_chercheuse_reserve_en_francais(page, live_server, live_chain, catalog):
    page.goto(live_server.url + "/")
    with page.expect_navigation():
        page.select_option("#language-select", "fr")
    assert page.get_attribute("html", "lang") == "fr"
    assert "Disponibilité et prix" in page.inner_text("#quote")

    fill_booking(page, lots="1", email="marie@example.org")
    page.fill("input[name=contact_email]", "pas-une-adresse")
    page.click("button.button-primary")
    assert "Saisissez une adresse de courriel valide." in page.inner_text("#field-contact_email")
    assert Order.objects.count() == 0

    page.fill("input[name=contact_email]", "marie@example.org")
    page.fill("textarea[name=ssh_keys]", make_ssh_key())
    page.click("button.button-primary")
    page.wait_for_url(re.compile(r".*/orders/BN-[^/]+/[^/]+/$"))
    assert "En attente de paiement" in page.inner_text("#order-status") or "paiement" in page.inner_text(
        "#order-status"
    )
    assert page.get_attribute("html", "lang") == "fr"
