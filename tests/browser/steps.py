"""What a researcher does in the browser, shared by the journeys and the fault tests."""

import re

from booking.models import Order
from tests.factories import make_ssh_key

PAYMENT_LINK = re.compile(r"ethereum:(0x[0-9a-fA-F]{40})@31337/transfer\?address=(0x[0-9a-fA-F]{40})&uint256=(\d+)")
ORDER_URL = re.compile(r".*/orders/BN-[^/]+/[^/]+/$")


def fill_booking(page, *, lots: str, email: str) -> None:
    page.fill("input[name=lots]", lots)
    page.check("input[name=days][value='7']")
    page.fill("input[name=contact_name]", "Ada Lovelace")
    page.fill("input[name=contact_email]", email)
    page.fill("input[name=organisation]", "Analytical Engines Lab")
    page.fill("textarea[name=billing_address]", "12 rue de la Paix\n75002 Paris")
    page.fill("input[name=billing_country]", "FR")
    page.fill("textarea[name=ssh_keys]", make_ssh_key())
    page.check("input[name=sharing][value='parameters_sharded']")
    page.check("input[name=hypothesis][value='make_possible']")
    page.fill("textarea[name=hypothesis_detail]", "A 13B model trains at all once sharded over the pair.")
    page.fill("textarea[name=hypothesis_measure]", "The run completes at 1,000 tokens per second or more.")
    page.check("input[name=accept_terms]")


def place_order(page, base_url: str, *, lots: str = "1", email: str = "ada@example.org") -> Order:
    page.goto(base_url + "/")
    fill_booking(page, lots=lots, email=email)
    page.click("button.button-primary")
    page.wait_for_url(ORDER_URL)
    return Order.objects.get(contact_email=email)


def pay_as_a_wallet(page, chain, *, account: int = 4, fraction: tuple[int, int] = (1, 1)) -> dict:
    """Pay what the page's EIP-681 link asks (or `fraction` of it), to the address it names; the receipt."""
    return pay_link(page.get_attribute("a[href^='ethereum:']", "href"), chain, account=account, fraction=fraction)


def pay_link(link: str, chain, *, account: int = 4, fraction: tuple[int, int] = (1, 1)) -> dict:
    """Pay what an EIP-681 token transfer link asks (or `fraction` of it), as a wallet would; the receipt."""
    match = PAYMENT_LINK.fullmatch(link)
    token, to, units = match.group(1).lower(), match.group(2), int(match.group(3))
    units = units * fraction[0] // fraction[1]
    payer = chain.accounts()[account]
    chain.mint(token, payer, units, sender=payer)
    return chain.send_token(token, to, units, sender=payer)


def browser_ready_order(page, base_url: str, *, email: str, admin_user) -> Order:
    """An order placed in the browser, paid (marked by an admin), approved and ready, as its lots were handed over."""
    from booking.models import OrderStatus
    from booking.services import order_transition
    from payments.selectors import current_invoice
    from payments.settlement import invoice_mark_paid

    order = place_order(page, base_url, email=email)
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    order.refresh_from_db()
    return order


def submitted(page, button, *, to: re.Pattern | None = None) -> None:
    """Press `button` (a locator), wait for the page its form answers with, and check it was not refused (and is
    `to`, when given)."""
    with page.expect_navigation():
        button.click()
    assert not page.refused, f"refused (403): {page.refused}"
    assert to is None or to.fullmatch(page.url), page.url


PASSWORD = "correct horse battery staple 42"


def log_in(page, url: str, username: str) -> None:
    """Open `url` as a staff member: Django's admin login comes first, then `url` itself."""
    page.goto(url)
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    with page.expect_navigation():
        page.click("input[type=submit]")
