"""The customer pages: booking, the order behind its secret link, cancel, resend my link."""

import html
import re
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from booking.models import Allocation, Order, OrderAccessToken, OrderEvent, OrderStatus
from tests.builders.broker import broker_down
from tests.builders.orders import order_url, place, place_in_french

pytestmark = pytest.mark.django_db


def comparable(content: bytes) -> str:
    """A page's HTML with its per-response CSRF token and the language switch's return path blanked."""
    return re.sub(
        r'("X-CSRFToken": "|name="csrfmiddlewaretoken" value="|name="next" type="hidden" value=")[^"]+',
        r"\1",
        content.decode(),
    )


def test_booking_page_shows_every_class_with_free_lots_and_the_price_of_the_chosen_window(client, catalog):
    response = client.get(reverse("customer:book"))

    assert response.status_code == 200
    page = response.content.decode()
    assert "NVIDIA B200 pair" in page and "NVIDIA H200 pair" in page and "AMD MI300X pair" in page
    assert "6 / 6" in page  # the six demo B200 lots are free
    assert "3150.00 EUR" in page  # a 7-day B200 lot, the default choice
    assert 'name="csrfmiddlewaretoken"' in page


def test_live_quote_answers_with_the_partial_only_and_updates_price_and_total(client, catalog, start_date):
    response = client.get(
        reverse("customer:book"),
        {
            "hardware_class": "h200-pair",
            "environment": "pytorch-2-4-cuda-12-4",
            "lots": "2",
            "start_date": start_date.isoformat(),
            "days": "30",
        },
        headers={"HX-Request": "true"},
    )

    page = response.content.decode()
    assert page.lstrip().startswith('<section class="panel quote" id="quote"')
    assert "<html" not in page
    assert "2 lots of NVIDIA H200 pair at 8400.00 EUR: <strong>16800.00 EUR</strong>" in page


def test_quote_explains_why_a_cuda_12_4_image_cannot_run_on_blackwell(client, catalog, start_date):
    response = client.get(
        reverse("customer:book"),
        {
            "hardware_class": "b200-pair",
            "environment": "pytorch-2-4-cuda-12-4",
            "lots": "1",
            "days": "7",
            "start_date": start_date.isoformat(),
        },
        headers={"HX-Request": "true"},
    )

    assert "does not target sm_100" in response.content.decode()


def test_placing_an_order_holds_specific_lots_and_opens_the_order_page(client, catalog, booking_data, start_date):
    order, token = place(client, booking_data(lots="2"))

    assert order.status == OrderStatus.AWAITING_PAYMENT
    assert order.total_price == 2 * order.price_per_lot
    allocations = list(Allocation.objects.filter(order=order))
    assert len(allocations) == 2 and len({allocation.lot_id for allocation in allocations}) == 2
    assert all(allocation.released_at is None for allocation in allocations)
    assert order.starts_at.date() == start_date and (order.ends_at - order.starts_at).days == 7
    assert [(event.from_status, event.to_status) for event in order.events.all()] == [("", "awaiting_payment")]
    assert order.ssh_keys.get().fingerprint.startswith("SHA256:")
    # Only the token's hash is stored.
    assert not OrderAccessToken.objects.filter(token_hash=token).exists()

    page = client.get(order_url(order, token))
    assert page.status_code == 200
    assert order.public_id in page.content.decode()
    assert "no-store" in page["Cache-Control"]
    assert page["Referrer-Policy"] == "same-origin"


@pytest.mark.django_db(transaction=True)  # the link is queued once the booking commits
def test_a_booking_while_the_broker_is_down_lands_and_the_operators_are_told_its_link_was_not_queued(
    client, catalog, booking_data, caplog, settings
):
    """The order is committed before its link e-mail is queued: a broker that does not answer then must not turn the
    booking into an error page saying nothing was booked (the researcher would book again, the lots stay held). The
    order page opens, and the lost e-mail is logged as an error (mailed to ADMINS in production)."""
    settings.ADMINS = [("Olga", "ops@binome.example")]
    with broker_down(), caplog.at_level("ERROR"):
        order, _token = place(client, booking_data(lots="1"))  # 302 to the order page, which opens

    assert order.status == OrderStatus.AWAITING_PAYMENT and Order.objects.count() == 1
    assert any("booking.send_order_link" in record.getMessage() for record in caplog.records), caplog.text
    (told,) = mail.outbox  # the operators, not the researcher (whose link e-mail was not queued)
    assert told.to == ["ops@binome.example"] and "booking.send_order_link was not queued" in told.subject


def test_the_order_link_is_emailed_in_the_customer_language_and_opens_the_order(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        order, _token = place_in_french(client, booking_data())

    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["ada@example.org"]
    assert order.public_id in message.subject and "Votre commande" in message.subject
    link = re.search(r"http://\S+/orders/\S+/", message.body).group()
    assert client.get(link.replace("http://127.0.0.1:8000", "")).status_code == 200


def test_order_page_is_404_without_its_token_and_the_same_for_a_missing_order(client, catalog, booking_data):
    order, token = place(client, booking_data())

    wrong_token = client.get(order_url(order, "x" * len(token)))
    missing_order = client.get(reverse("customer:order", kwargs={"public_id": "BN-NOPE2345", "token": token}))
    no_token = client.get(f"/orders/{order.public_id}/")

    assert wrong_token.status_code == missing_order.status_code == no_token.status_code == 404
    assert comparable(wrong_token.content) == comparable(missing_order.content)
    assert order.public_id not in comparable(wrong_token.content)  # only the requested path is echoed


def test_an_order_s_links_stop_once_its_files_are_gone(client, catalog, booking_data):
    from booking.services import order_cancel_by_customer
    from provisioning.models import OperatorSettings

    order, token = place(client, booking_data())
    order_cancel_by_customer(order=order)
    grace = timedelta(days=OperatorSettings.current().wipe_after_days)
    now = timezone.now()

    Order.objects.filter(pk=order.pk).update(
        starts_at=now - timedelta(days=30), ends_at=now - grace + timedelta(hours=1)
    )
    assert client.get(order_url(order, token)).status_code == 200  # still within the grace period
    Order.objects.filter(pk=order.pk).update(ends_at=now - grace - timedelta(hours=1))
    assert client.get(order_url(order, token)).status_code == 404


def test_new_links_retire_the_oldest_beyond_five(client, catalog, booking_data):
    from booking.links import issue_token

    order, first = place(client, booking_data())
    tokens = [issue_token(order=order) for _ in range(5)]
    assert OrderAccessToken.objects.filter(order=order).count() == 5
    assert client.get(order_url(order, first)).status_code == 404  # the sixth link retired the first
    assert all(client.get(order_url(order, token)).status_code == 200 for token in tokens)


def test_status_poll_returns_the_partial_and_stops_once_the_order_is_settled(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    order, token = place(client, booking_data())

    live = client.get(order_url(order, token), headers={"HX-Request": "true"})
    assert live.status_code == 200 and 'hx-trigger="every 5s"' in live.content.decode()

    # The cached block is invalidated when the cancellation commits (the test database never commits).
    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("customer:order-cancel", kwargs={"public_id": order.public_id, "token": token}))
    settled = client.get(order_url(order, token), headers={"HX-Request": "true"})
    assert settled.status_code == 286  # htmx: stop polling
    assert "Cancelled" in settled.content.decode()


def test_customer_cancels_before_paying_and_the_lots_are_free_again(client, catalog, booking_data):
    order, token = place(client, booking_data(lots="6"))
    assert (
        "0 / 6"
        in client.get(
            reverse("customer:book"),
            {
                "hardware_class": "b200-pair",
                "environment": "pytorch-2-7-cuda-12-8",
                "lots": "1",
                "days": "7",
                "start_date": booking_data()["start_date"],
            },
        ).content.decode()
    )

    response = client.post(reverse("customer:order-cancel", kwargs={"public_id": order.public_id, "token": token}))

    assert response.status_code == 302
    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED
    assert not Allocation.objects.filter(order=order, released_at__isnull=True).exists()
    event = order.events.last()
    assert (event.from_status, event.to_status, event.actor_kind) == ("awaiting_payment", "cancelled", "customer")
    place(client, booking_data(lots="6"))  # the same six lots can be booked again


def test_cancel_needs_the_token_and_a_post(client, catalog, booking_data):
    order, token = place(client, booking_data())
    cancel = reverse("customer:order-cancel", kwargs={"public_id": order.public_id, "token": token})

    assert client.get(cancel).status_code == 405
    assert client.post(cancel.replace(token, "wrong-token")).status_code == 404
    order.refresh_from_db()
    assert order.status == OrderStatus.AWAITING_PAYMENT


def test_sold_out_answers_clearly_with_the_next_dates_that_fit(client, catalog, booking_data, start_date):
    place(client, booking_data(lots="6", days="7"))

    response = client.post(reverse("customer:book"), booking_data(lots="1", days="7"))

    page = response.content.decode()
    assert response.status_code == 200
    assert "Sold out: not enough NVIDIA B200 pair lots are free for these dates." in page
    assert "Nothing was booked and nothing is owed; your answers are kept." in page
    # Held from start−6 h to start+7 d+6 h: a new 7-day window (itself needing 6 h before) fits from day 8.
    next_date = (start_date + timedelta(days=8)).isoformat()
    assert f'name="start_date" value="{next_date}"' in page
    assert Order.objects.count() == 1

    # One click books the same answers from that date: the form on the page carries them all.
    form = re.search(r'<form[^>]*class="next-dates">(.*?)</form>', page, re.S).group(1)
    kept = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form))
    assert kept["contact_email"] == "ada@example.org" and kept["ssh_keys"].startswith("ssh-ed25519 ")
    assert "start_date" not in kept
    booked = client.post(
        reverse("customer:book"), {**{k: html.unescape(v) for k, v in kept.items()}, "start_date": next_date}
    )
    assert booked.status_code == 302
    order = Order.objects.latest("created_at")
    assert order.starts_at.date().isoformat() == next_date and order.contact_email == "ada@example.org"
    assert order.hypothesis_detail == booking_data()["hypothesis_detail"]


def test_after_a_sold_out_answer_a_released_lot_can_be_booked_at_once(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    """The sold-out answer is cached until availability changes: a cancellation must lift it immediately."""
    order, token = place(client, booking_data(lots="6"))
    assert "Sold out" in client.post(reverse("customer:book"), booking_data(lots="1")).content.decode()
    assert "Sold out" in client.post(reverse("customer:book"), booking_data(lots="1")).content.decode()  # cached

    with django_capture_on_commit_callbacks(execute=True):
        client.post(reverse("customer:order-cancel", kwargs={"public_id": order.public_id, "token": token}))
    assert client.post(reverse("customer:book"), booking_data(lots="1")).status_code == 302


def test_each_sold_out_answer_keeps_only_its_own_visitors_answers(client, catalog, booking_data):
    """The sold-out page is drawn for each visitor: their own answers, CSRF token and messages, never someone
    else's."""
    from django.test import Client

    ada = client
    ada.post(reverse("customer:book"), booking_data(lots="6"))  # held; "Your lots are held" waits for her next page
    organisation = 'Q&A "Lab" __binome_csrf_token__'  # quoted as typed, even what looks like a placeholder
    first = ada.post(reverse("customer:book"), booking_data(lots="1", organisation=organisation))
    grace = Client()
    second = grace.post(reverse("customer:book"), booking_data(lots="1", contact_email="grace@example.org"))

    mine, theirs = first.content.decode(), second.content.decode()
    assert mine.count('value="ada@example.org"') == theirs.count('value="grace@example.org"') == 2  # both forms
    assert "grace@" not in mine and "ada@" not in theirs
    assert mine.count('value="Q&amp;A &quot;Lab&quot; __binome_csrf_token__"') == 2
    assert mine.count("__binome_") == 2 and theirs.count("__binome_") == 0
    for page, visitor in ((mine, ada), (theirs, grace)):
        tokens = set(re.findall(r'name="csrfmiddlewaretoken" value="([^"]+)"', page))
        assert tokens and all(_unmask(token) == _unmask(visitor.cookies["csrftoken"].value) for token in tokens)
    assert "Your lots are held" in mine and "Your lots are held" not in theirs


def _unmask(token: str) -> str:
    from django.middleware.csrf import _unmask_cipher_token

    return _unmask_cipher_token(token) if len(token) == 64 else token


def test_change_my_choices_goes_back_to_the_form_with_the_answers_kept(client, catalog, booking_data):
    place(client, booking_data(lots="6"))
    page = client.post(reverse("customer:book"), booking_data(lots="1")).content.decode()
    form = re.findall(r"<form[^>]*>(.*?)</form>", page, re.S)[-1]
    kept = {k: html.unescape(v) for k, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form)}
    assert kept["action"] == "quote"

    back = client.post(reverse("customer:book"), kept).content.decode()
    assert 'value="ada@example.org"' in back and "Sold out" in back  # the quote says so again, the form is full
    assert Order.objects.count() == 1


def test_asking_for_more_lots_than_exist_says_how_many_exist(client, catalog, booking_data):
    response = client.post(
        reverse("customer:book"),
        booking_data(hardware_class="mi300x-pair", environment="pytorch-2-6-rocm-6-4", lots="2"),
    )

    assert "Only 1 lot of AMD MI300X pair exists." in response.content.decode()
    assert Order.objects.count() == 0


def test_resend_link_gives_the_same_answer_for_known_and_unknown_addresses(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    order, _token = place(client, booking_data())
    url = reverse("customer:resend-link")

    with django_capture_on_commit_callbacks(execute=True):
        known = client.post(url, {"email": "ADA@example.org"})
        unknown = client.post(url, {"email": "nobody@example.org"})

    assert known.status_code == unknown.status_code == 200
    assert comparable(known.content) == comparable(unknown.content)
    assert [message.to for message in mail.outbox] == [["ada@example.org"]]
    assert order.public_id in mail.outbox[0].body
    link = re.search(r"http://\S+/orders/\S+/", mail.outbox[0].body).group()
    assert client.get(link.replace("http://127.0.0.1:8000", "")).status_code == 200


def test_resend_link_is_rate_limited_per_address_and_per_client(client, catalog):
    url = reverse("customer:resend-link")
    answers = [client.post(url, {"email": "someone@example.org"}).status_code for _ in range(6)]

    assert answers == [200] * 5 + [429]
    assert "Too many requests" in client.post(url, {"email": "other@example.org"}).content.decode()


def test_booking_is_rate_limited_per_client(client, catalog, booking_data, settings):
    settings.RATELIMIT_BOOKING = "2/h"
    answers = [client.post(reverse("customer:book"), booking_data(lots="1")).status_code for _ in range(3)]

    assert answers == [302, 302, 429]
    assert Order.objects.count() == 2


def test_every_transition_is_recorded_with_its_actor(client, catalog, booking_data):
    order, token = place(client, booking_data())
    client.post(reverse("customer:order-cancel", kwargs={"public_id": order.public_id, "token": token}))

    events = list(OrderEvent.objects.filter(order=order).values_list("from_status", "to_status", "actor_kind"))
    assert events == [("", "awaiting_payment", "customer"), ("awaiting_payment", "cancelled", "customer")]


@pytest.mark.parametrize(("language", "title_word"), [("en", "share"), ("fr", "partagent")])
def test_the_guide_exists_in_both_languages_with_every_section_the_booking_page_links_to(
    client, catalog, language, title_word
):
    client.cookies["django_language"] = language
    booking = client.get(reverse("customer:book")).content.decode()
    anchors = set(re.findall(r'href="/guide/#([\w-]+)"', booking))
    assert anchors == {"share", "alternatives", "window", "blackwell", "split-trial"}

    guide = client.get(reverse("customer:guide"))
    page = guide.content.decode()
    assert guide.status_code == 200 and f'<html lang="{language}">' in page
    for anchor in anchors:
        assert f'id="{anchor}"' in page
    assert title_word in page.lower()


def poll(client, order: Order, token: str):
    return client.get(order_url(order, token), headers={"HX-Request": "true"})


def test_the_first_poll_of_a_fresh_order_page_is_unchanged_and_a_transition_shows_at_once(
    client, catalog, booking_data, django_assert_num_queries, django_capture_on_commit_callbacks
):
    """The full page names its own rendering in the block's poll URL: its very first poll is answered 204
    without a query while nothing changed, and with the new block as soon as something did."""
    from booking.services import order_transition

    order, token = place(client, booking_data())
    page = client.get(order_url(order, token)).content.decode()
    url = html.unescape(re.search(r'hx-get="([^"]+\?v=[0-9a-f]+)"', page).group(1))
    with django_assert_num_queries(0):
        unchanged = client.get(url, headers={"HX-Request": "true"})
    assert unchanged.status_code == 204

    with django_capture_on_commit_callbacks(execute=True):
        order_transition(order=order, to_status=OrderStatus.PAYMENT_PROCESSING, actor_kind="system")
    changed = client.get(url, headers={"HX-Request": "true"})
    assert changed.status_code == 200 and "being confirmed on chain" in changed.content.decode()
    assert changed["Referrer-Policy"] == "same-origin" and "no-store" in changed["Cache-Control"]
    assert "__binome_csrf_token__" not in changed.content.decode()


def test_a_write_committed_while_the_page_is_drawn_never_leaves_it_current(
    client, catalog, booking_data, monkeypatch, django_capture_on_commit_callbacks
):
    """The order changes right after the page read it: the page shows the old state, so its poll must not be
    answered "unchanged"; it brings the new state."""
    from booking.services import order_transition
    from web.customer import order as views

    order, token = place(client, booking_data())
    read_order = views._order_or_404

    def a_write_lands_after_the_read(public_id: str, token: str) -> Order:
        found = read_order(public_id, token)
        with django_capture_on_commit_callbacks(execute=True):
            order_transition(order=order, to_status=OrderStatus.PAYMENT_PROCESSING, actor_kind="system")
        return found

    monkeypatch.setattr(views, "_order_or_404", a_write_lands_after_the_read)
    page = client.get(order_url(order, token)).content.decode()
    monkeypatch.setattr(views, "_order_or_404", read_order)
    assert "Waiting for your transfer." in page
    url = html.unescape(re.search(r'hx-get="([^"]+\?v=[0-9a-f]+)"', page).group(1))
    polled = client.get(url, headers={"HX-Request": "true"})
    assert polled.status_code == 200 and "being confirmed on chain" in polled.content.decode()


def test_the_status_block_is_only_served_for_its_own_order_link_and_language(client, catalog, booking_data):
    mine, my_token = place(client, booking_data())
    theirs, their_token = place(client, booking_data(contact_email="other@example.org"))
    assert poll(client, mine, my_token).status_code == poll(client, theirs, their_token).status_code == 200

    # Another order's token, or no valid token, never reaches the block.
    assert poll(client, mine, their_token).status_code == 404
    assert poll(client, mine, "x" * len(my_token)).status_code == 404
    assert my_token in poll(client, mine, my_token).content.decode()
    assert their_token not in poll(client, mine, my_token).content.decode()

    # A second link to the same order gets a block with its own token in the forms' addresses.
    second_token = _second_link(mine)
    block = poll(client, mine, second_token).content.decode()
    assert second_token in block and my_token not in block

    client.cookies["django_language"] = "fr"
    assert "En attente de votre transfert." in poll(client, mine, my_token).content.decode()


def _second_link(order: Order) -> str:
    """As "send me my order link again" mints one."""
    from booking.links import issue_token

    return issue_token(order=order)


def test_a_page_that_already_shows_the_current_block_gets_no_content(
    client, catalog, booking_data, django_assert_num_queries, django_capture_on_commit_callbacks
):
    """The block names its own entry in its poll URL; while nothing changed, the poll answers 204 (htmx keeps the
    block), and a change brings the new block at once."""
    from booking.services import order_transition

    order, token = place(client, booking_data())
    block = poll(client, order, token).content.decode()
    url = html.unescape(re.search(r'hx-get="([^"]+\?v=[0-9a-f]+)"', block).group(1))
    with django_assert_num_queries(0):
        unchanged = client.get(url, headers={"HX-Request": "true"})
    assert unchanged.status_code == 204 and unchanged.content == b""
    assert unchanged["Referrer-Policy"] == "same-origin" and "no-store" in unchanged["Cache-Control"]

    with django_capture_on_commit_callbacks(execute=True):
        order_transition(order=order, to_status=OrderStatus.PAYMENT_PROCESSING, actor_kind="system")
    changed = client.get(url, headers={"HX-Request": "true"})
    assert changed.status_code == 200 and "being confirmed on chain" in changed.content.decode()
    assert re.search(r'hx-get="[^"]+\?v=([0-9a-f]+)"', changed.content.decode()).group(1) not in url

    wrong = url.replace(token, "w" * len(token))
    assert client.get(wrong, headers={"HX-Request": "true"}).status_code == 404  # the id opens nothing by itself


def _polled_url(client, order: Order, token: str) -> str:
    block = poll(client, order, token).content.decode()
    return html.unescape(re.search(r'hx-get="([^"]+\?v=[0-9a-f]+)"', block).group(1))


def test_an_unchanged_poll_is_answered_before_sessions_and_csrf_with_the_security_headers(
    client, catalog, booking_data
):
    """The 204 comes from web.poll, ahead of the session, CSRF and messages: it sets no cookie, yet
    carries the headers every answer has."""
    order, token = place(client, booking_data())
    url = _polled_url(client, order, token)
    client.cookies.clear()  # a poll from a page whose cookies expired is just as unchanged

    unchanged = client.get(url, headers={"HX-Request": "true"})
    assert unchanged.status_code == 204 and unchanged.cookies == {}
    assert "Content-Language" not in unchanged and "Vary" not in unchanged  # LocaleMiddleware never ran
    assert "script-src 'self'" in unchanged["Content-Security-Policy"]
    assert unchanged["X-Frame-Options"] == "DENY" and unchanged["X-Content-Type-Options"] == "nosniff"
    assert unchanged["Referrer-Policy"] == "same-origin" and unchanged["X-Robots-Tag"] == "noindex, nofollow"
    assert "no-store" in unchanged["Cache-Control"]


def test_a_poll_id_gives_no_content_only_to_the_htmx_poll_of_its_own_link(client, catalog, booking_data):
    mine, my_token = place(client, booking_data())
    theirs, their_token = place(client, booking_data(contact_email="other@example.org"))
    url = _polled_url(client, mine, my_token)
    rendering_id = url.rsplit("?v=", 1)[1]

    # Opened as a page (no HX-Request), the same address is the whole order page.
    page = client.get(url)
    assert page.status_code == 200 and b"<html" in page.content
    # The id of my block, sent with another order's link, is no answer about that order: its own block comes.
    other = client.get(order_url(theirs, their_token) + f"?v={rendering_id}", headers={"HX-Request": "true"})
    assert other.status_code == 200 and their_token in other.content.decode()
    # Hostile ids name nothing: the block itself comes back, never an error.
    for hostile in ("", "0" * 16, rendering_id.upper(), rendering_id + "0", "%00", "x" * 5000, "../../"):
        answer = client.get(order_url(mine, my_token), {"v": hostile}, headers={"HX-Request": "true"})
        assert answer.status_code == 200 and "Waiting for your transfer." in answer.content.decode(), hostile


def test_an_unchanged_poll_for_an_unknown_host_is_refused(client, catalog, booking_data):
    order, token = place(client, booking_data())
    url = _polled_url(client, order, token)
    assert client.get(url, headers={"HX-Request": "true"}, HTTP_HOST="evil.example").status_code == 400


def _language_next(page: str) -> str:
    return html.unescape(re.search(r'<input name="next" type="hidden" value="([^"]*)">', page).group(1))


def test_a_shared_booking_page_never_carries_the_address_another_visitor_typed(client, catalog):
    """The language switch returns to the page as drawn from its quote parameters: a first visitor's repeated or
    odd parameters never reach the next visitor through the shared page cache."""
    from django.test import Client

    first = client.get("/?lots=evil-first-value&lots=2")
    assert first.status_code == 200 and _language_next(first.content.decode()) == "/?lots=2"
    victim = Client().get("/?lots=2").content.decode()
    assert "evil" not in victim and _language_next(victim) == "/?lots=2"

    # Text that could pass for a placeholder is drawn for its visitor alone, never shared, never replaced.
    odd = Client().get("/?lots=__binome_csrf_token__")
    assert _language_next(odd.content.decode()) == "/?lots=__binome_csrf_token__"
    assert odd.cookies["csrftoken"].value not in odd.content.decode()


def test_a_shared_sold_out_page_never_carries_the_address_another_visitor_posted_to(client, catalog, booking_data):
    from django.test import Client

    place(client, booking_data(lots="6"))
    url = "/?ssh_keys=ssh-ed25519+AAAAevil&__binome_kept_answers__&__binome_csrf_token__"
    attacker = client.post(url, booking_data(lots="1", contact_email="mallory@example.org")).content.decode()
    assert "Sold out" in attacker and _language_next(attacker) == "/"

    grace = Client().post("/", booking_data(lots="1", contact_email="grace@example.org")).content.decode()
    assert "Sold out" in grace and _language_next(grace) == "/"
    assert "AAAAevil" not in grace and "mallory" not in grace and grace.count('value="grace@example.org"') == 2


def test_junk_bookings_do_not_count_against_the_limit(client, catalog, booking_data, settings):
    settings.RATELIMIT_BOOKING = "2/h"
    junk = [client.post(reverse("customer:book"), booking_data(contact_email="nope")).status_code for _ in range(30)]

    assert junk == [200] * 30  # the form again, with its error: costs nothing, counts nothing
    assert place(client, booking_data(lots="1"))[0].status == OrderStatus.AWAITING_PAYMENT


def test_malformed_addresses_do_not_count_against_the_resend_limit(client, catalog):
    url = reverse("customer:resend-link")
    junk = [client.post(url, {"email": "not an address"}).status_code for _ in range(10)]

    assert junk == [200] * 10
    assert client.post(url, {"email": "ada@example.org"}).status_code == 200


def _limit_unpaid_lots(limit: int) -> None:
    from booking.models import BookingPolicy

    policy = BookingPolicy.current()
    policy.max_unpaid_lots_per_client = limit
    policy.save()


def test_one_email_cannot_hold_more_unpaid_lots_than_the_operator_allows(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    _limit_unpaid_lots(3)
    with django_capture_on_commit_callbacks(execute=True):
        first, _token = place(client, booking_data(lots="2"))
    mailed = re.findall(r"http://\S+/orders/\S+/", mail.outbox[-1].body)[0].replace("http://127.0.0.1:8000", "")
    assert client.get(mailed).status_code == 200  # its owner opens the link sent to the address: it counts now
    elsewhere = Client(REMOTE_ADDR="198.51.100.7")  # another connection, the same e-mail (any case)

    refused = elsewhere.post(reverse("customer:book"), booking_data(lots="2", contact_email="ADA@example.org"))

    page = html.unescape(refused.content.decode())
    assert refused.status_code == 200 and Order.objects.count() == 1
    assert "already holds 2 unpaid lots, and one client may hold at most 3 at a time" in page
    assert f"({first.hold_expires_at:%Y-%m-%d %H:%M} UTC)" in page
    assert place(elsewhere, booking_data(lots="1", contact_email="ada@example.org"))[0].lot_count == 1


def test_one_client_address_cannot_hold_more_under_other_emails_and_it_frees_once_paid(
    client, catalog, booking_data, admin_user
):
    from payments.selectors import current_invoice
    from payments.settlement import invoice_mark_paid

    _limit_unpaid_lots(2)
    first, _token = place(client, booking_data(lots="2"))

    refused = client.post(reverse("customer:book"), booking_data(lots="1", contact_email="bob@example.org"))
    assert refused.status_code == 200 and "one client may hold at most 2" in html.unescape(refused.content.decode())

    invoice_mark_paid(invoice=current_invoice(first), user=admin_user, reason="test")  # paid lots are not held free
    assert place(client, booking_data(lots="2", contact_email="bob@example.org"))[0].lot_count == 2


def test_the_unpaid_lots_message_is_in_french_for_a_french_client(client, catalog, booking_data):
    _limit_unpaid_lots(1)
    place_in_french(client, booking_data(lots="1"))

    refused = client.post(reverse("customer:book"), booking_data(lots="1"))

    assert "tient déjà 1 lot impayé, et un client peut en tenir au plus 1" in html.unescape(refused.content.decode())


def test_a_customer_revokes_every_link_of_an_order_and_gets_a_new_one_by_email(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        order, token = place(client, booking_data())
        client.post(reverse("customer:resend-link"), {"email": "ada@example.org"})
    mailed = re.findall(r"http://\S+/orders/\S+/", mail.outbox[-1].body)[0].replace("http://127.0.0.1:8000", "")
    page = client.get(order_url(order, token)).content.decode()
    poll = html.unescape(re.search(r'hx-get="([^"]*\?v=[0-9a-f]{16})"', page).group(1))
    mail.outbox.clear()

    with django_capture_on_commit_callbacks(execute=True):
        revoked = client.post(
            reverse("customer:order-revoke-links", kwargs={"public_id": order.public_id, "token": token})
        )

    answer = html.unescape(revoked.content.decode())
    assert revoked.status_code == 200 and revoked["Referrer-Policy"] == "same-origin"
    assert f"Every link to order {order.public_id} has stopped working" in answer and "a•••@example.org" in answer
    assert client.get(order_url(order, token)).status_code == 404
    assert client.get(mailed).status_code == 404
    assert client.get(poll, headers={"HX-Request": "true"}).status_code == 404  # no "unchanged" 204 either
    assert [message.to for message in mail.outbox] == [["ada@example.org"]]
    fresh = re.search(r"http://\S+/orders/\S+/", mail.outbox[0].body).group().replace("http://127.0.0.1:8000", "")
    assert client.get(fresh).status_code == 200
    assert order.events.filter(reason="links revoked", evidence__links=3).exists()


def test_revoking_links_needs_the_right_link_and_is_explained_in_french(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    order, token = place_in_french(client, booking_data())

    wrong = client.post(
        reverse("customer:order-revoke-links", kwargs={"public_id": order.public_id, "token": "x" * 43})
    )
    with django_capture_on_commit_callbacks(execute=True):
        revoked = client.post(
            reverse("customer:order-revoke-links", kwargs={"public_id": order.public_id, "token": token})
        )

    assert wrong.status_code == 404
    assert "Tous les liens vers la commande" in html.unescape(revoked.content.decode())
    assert OrderAccessToken.objects.filter(order=order).count() == 1  # the one just mailed


def test_an_order_address_of_any_length_is_a_404_never_an_error(client, catalog):
    for public_id in ("BN-" + "A" * 300, "x" * 5000):
        page = client.get(f"/orders/{public_id}/{'t' * 43}/")
        poll = client.get(f"/orders/{public_id}/{'t' * 43}/?v={'0' * 16}", headers={"HX-Request": "true"})
        assert page.status_code == poll.status_code == 404


def headers_a_browser_sends(page, *, page_url: str, action_url: str) -> dict[str, str]:
    """The `Origin` and `Referer` Chromium sends with a form's POST from `page` (the answer to a GET of `page_url`)
    to `action_url`: Fetch's "serialize a request origin" and "determine request's referrer" for a navigation, under
    the page's Referrer-Policy (Chromium's default when it sets none). A test client sends neither unless told."""
    source, target = urlsplit(page_url), urlsplit(action_url)
    policy = page.get("Referrer-Policy", "strict-origin-when-cross-origin").split(",")[-1].strip()
    same_origin = (source.scheme, source.netloc) == (target.scheme, target.netloc)
    downgrade = source.scheme == "https" and target.scheme != "https"
    origin = f"{source.scheme}://{source.netloc}"
    if policy == "no-referrer" or (policy == "same-origin" and not same_origin):
        return {"Origin": "null"}
    if policy in ("strict-origin", "strict-origin-when-cross-origin", "no-referrer-when-downgrade") and downgrade:
        return {"Origin": "null"}
    full = same_origin and policy in ("same-origin", "strict-origin-when-cross-origin", "origin-when-cross-origin")
    return {"Origin": origin, "Referer": page_url if full or policy == "unsafe-url" else origin + "/"}


def _form_token(page) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)


ORDER_PAGE_ACTIONS = {
    # action: (its URL, what the form sends, how to check it took effect)
    "cancel": (
        lambda order, token: reverse("customer:order-cancel", kwargs={"public_id": order.public_id, "token": token}),
        lambda order, token: {},
        lambda order, token, client: Order.objects.get(pk=order.pk).status == OrderStatus.CANCELLED,
    ),
    "revoke links": (
        lambda order, token: reverse(
            "customer:order-revoke-links", kwargs={"public_id": order.public_id, "token": token}
        ),
        lambda order, token: {},
        lambda order, token, client: client.get(order_url(order, token)).status_code == 404,
    ),
    "language": (
        lambda order, token: reverse("set_language"),
        lambda order, token: {"language": "fr", "next": order_url(order, token)},
        lambda order, token, client: 'lang="fr"' in client.get(order_url(order, token)).content.decode(),
    ),
}


@pytest.mark.parametrize("secure", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("action", list(ORDER_PAGE_ACTIONS))
def test_the_order_pages_forms_pass_the_csrf_check_with_the_headers_a_browser_sends(
    client, catalog, booking_data, secure, action
):
    url_of, data_of, took_effect = ORDER_PAGE_ACTIONS[action]
    order, token = place(client, booking_data(lots="1"))
    browser = Client(enforce_csrf_checks=True)  # checks CSRF as production does; the default test client does not
    page_url = f"{'https' if secure else 'http'}://testserver{order_url(order, token)}"
    page = browser.get(page_url, secure=secure)
    action_url = f"{'https' if secure else 'http'}://testserver{url_of(order, token)}"
    headers = headers_a_browser_sends(page, page_url=page_url, action_url=action_url)

    answer = browser.post(
        action_url, {"csrfmiddlewaretoken": _form_token(page), **data_of(order, token)}, headers=headers, secure=secure
    )

    assert answer.status_code in (200, 302), (answer.status_code, headers)  # 403 under `no-referrer`: Origin null
    assert took_effect(order, token, browser)


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "null"},  # a page (or sandboxed frame) that hides its origin: it could be anyone's
        {"Origin": "http://attacker.example"},
        {"Origin": "http://attacker.example", "Referer": "http://testserver/"},
    ],
    ids=["opaque origin", "another site", "another site with a forged referer"],
)
def test_a_cancel_posted_from_another_origin_is_refused_even_with_the_csrf_token(
    client, catalog, booking_data, headers
):
    order, token = place(client, booking_data(lots="1"))
    browser = Client(enforce_csrf_checks=True)
    page = browser.get(order_url(order, token))

    answer = browser.post(
        reverse("customer:order-cancel", kwargs={"public_id": order.public_id, "token": token}),
        {"csrfmiddlewaretoken": _form_token(page)},
        headers=headers,
    )

    assert answer.status_code == 403
    assert Order.objects.get(pk=order.pk).status == OrderStatus.AWAITING_PAYMENT


def test_the_booking_form_follows_the_method_and_the_order_keeps_what_was_written(client, catalog, booking_data):
    page = client.get(reverse("customer:book")).content.decode()
    # What the cards share, then the hypothesis with its measure, then the machines and window, then the contact.
    positions = [
        page.index(f'name="{name}"')
        for name in ("sharing", "hypothesis", "hypothesis_detail", "hypothesis_measure", "hardware_class", "days")
    ]
    assert positions == sorted(positions)
    assert page.index('name="checkpoint_interval_hours"') > page.index('name="days"')
    assert page.index('name="contact_name"') > page.index('name="days"')

    order, token = place(client, booking_data(sharing="layers_split"))

    assert order.sharing == "layers_split"
    assert order.hypothesis_measure == booking_data()["hypothesis_measure"]
    shown = html.unescape(client.get(order_url(order, token)).content.decode())
    assert "Layers split across the two cards (pipeline)" in shown
    assert booking_data()["hypothesis_measure"] in shown
