"""Property-based hostile input (hypothesis) over the forms and endpoints: whatever arrives, no server error, and
nothing is saved for an invalid input. Over 1,000 generated requests in all, and large bodies (up to the body
limit) answered at a cost their limits bound: counted (bytes read, text searched by a pattern, queries), not timed.
bench/hostile.py times such bodies against gunicorn."""

import re

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from hypothesis import HealthCheck, event, example, given, settings, target
from hypothesis import strategies as st

from booking import split_trial_report
from booking.models import Order, OrderEvent
from payments.models import Invoice
from tests.builders.orders import place
from web.customer import forms as customer_forms

pytestmark = pytest.mark.django_db

EXAMPLES = 150  # × 7 properties (two requests each for some): well over 1,000 generated inputs
RUN = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
OK = {200, 302, 400, 404, 405, 413, 429}

nasty_text = st.one_of(
    st.text(max_size=300),
    st.sampled_from(
        [
            "<script>alert(1)</script>",
            "' OR 1=1 --",
            "\x00",
            "../../etc/passwd",
            "9" * 400,
            "-1",
            "1e309",
            "NaN",
            "2027-02-30",
            "b200-pair",
            "pytorch-2-7-cuda-12-8",
            "ssh-ed25519 AAAA",
            "💥" * 50,
            "\u202e",
            "0x" + "f" * 64,
            "31337:ETH",
            "²",  # str.isdigit() says yes, int() says no
            "٣:dEURC",
            "",
        ]
    ),
)
BOOKING_FIELDS = [
    "hardware_class",
    "environment",
    "lots",
    "start_date",
    "days",
    "contact_name",
    "contact_email",
    "organisation",
    "billing_address",
    "billing_country",
    "vat_number",
    "purchase_order",
    "messenger",
    "ssh_keys",
    "sharing",
    "hypothesis",
    "hypothesis_detail",
    "hypothesis_measure",
    "checkpoint_interval_hours",
    "stop_criteria",
    "notes",
]


@pytest.fixture(autouse=True)
def _no_rate_limits(settings):
    settings.RATELIMIT_ENABLE = False


@RUN
@given(data=st.dictionaries(st.sampled_from(BOOKING_FIELDS), nasty_text, max_size=len(BOOKING_FIELDS)))
def test_booking_posts(client, catalog, data):
    before = Order.objects.count()
    response = client.post(reverse("customer:book"), data)
    assert response.status_code in OK
    if response.status_code != 302:
        assert Order.objects.count() == before


@RUN
@given(
    params=st.dictionaries(
        st.sampled_from(
            [
                "hardware_class",
                "environment",
                "lots",
                "start_date",
                "days",
                "utm",
                "fit-parameters_billion",
                "fit-mode",
                "fit-batch",
            ]
        ),
        nasty_text,
        max_size=6,
    ),
    htmx=st.booleans(),
)
def test_booking_and_advisor_gets(client, catalog, params, htmx):
    headers = {"HX-Request": "true"} if htmx else {}
    for url in (reverse("customer:book"), reverse("customer:fit")):
        assert client.get(url, params, headers=headers).status_code in OK


@RUN
@given(email=nasty_text)
def test_resend_link(client, catalog, email):
    assert client.post(reverse("customer:resend-link"), {"email": email}).status_code in OK


URLS = {"paid": "order-paid", "asset": "order-asset", "cancel": "order-cancel"}


@RUN
@given(action=st.sampled_from(sorted(URLS)), value=nasty_text)
def test_order_actions_without_the_right_token_change_nothing(client, catalog, booking_data, action, value):
    order = Order.objects.first() or place(client, booking_data())[0]
    events, invoices = OrderEvent.objects.count(), Invoice.objects.count()
    url = reverse(f"customer:{URLS[action]}", kwargs={"public_id": order.public_id, "token": "t" * 43})
    assert client.post(url, {"tx_hint": value, "asset": value}).status_code == 404
    assert OrderEvent.objects.count() == events and Invoice.objects.count() == invoices


@RUN
@given(tx_hint=nasty_text, asset=nasty_text)
@example(tx_hint="", asset="²:dEURC")  # once a 500: "²".isdigit() is true
def test_payment_actions_with_the_token_refuse_hostile_values(client, catalog, booking_data, tx_hint, asset):
    order = Order.objects.first()
    if order is None:
        order, token = place(client, booking_data())
        test_payment_actions_with_the_token_refuse_hostile_values.token = token
    kwargs = {"public_id": order.public_id, "token": test_payment_actions_with_the_token_refuse_hostile_values.token}
    invoice = Invoice.objects.get(order=order, status="new")
    assert client.post(reverse("customer:order-paid", kwargs=kwargs), {"tx_hint": tx_hint}).status_code in OK
    assert client.post(reverse("customer:order-asset", kwargs=kwargs), {"asset": asset}).status_code in OK
    invoice.refresh_from_db()
    # Only a well-formed transaction hash is ever kept as a hint.
    assert invoice.customer_tx_hint == "" or re.fullmatch(r"0x[0-9a-f]{64}", invoice.customer_tx_hint)
    assert Invoice.objects.filter(order=order).exclude(status="invalid").count() == 1


@RUN
@given(content=st.one_of(st.binary(max_size=2000), nasty_text.map(str.encode)))
def test_split_trial_uploads_with_the_right_token(client, catalog, booking_data, content):
    from booking.models import OrderStatus, SplitTrialReport
    from booking.services import order_transition

    order = Order.objects.filter(status=OrderStatus.READY).first()
    if order is None:
        order, token = place(client, booking_data())
        for status in ("paid", "approved", "provisioning", "ready"):
            order_transition(order=order, to_status=status, actor_kind="system")
        test_split_trial_uploads_with_the_right_token.token = token
    url = reverse(
        "customer:order-split-trial",
        kwargs={"public_id": order.public_id, "token": test_split_trial_uploads_with_the_right_token.token},
    )
    response = client.post(url, {"report": SimpleUploadedFile("r.json", content)})
    assert response.status_code in OK
    assert not SplitTrialReport.objects.exists()


@RUN
@given(action=nasty_text, reason=nasty_text, extra=nasty_text)
@example(action="extend", reason="", extra="²")
@example(action="reassign", reason="", extra="²")
@example(action="move", reason="", extra="-1")
def test_console_actions_by_an_operator(client, catalog, booking_data, django_user_model, action, reason, extra):
    operator = django_user_model.objects.filter(username="olga").first()
    if operator is None:
        operator = django_user_model.objects.create_user("olga", password="a-long-password-here", is_staff=True)
        operator.user_permissions.add(Permission.objects.get(codename="operate_orders"))
    client.force_login(operator)
    order = Order.objects.first() or place(client, booking_data())[0]
    safe_action = "".join(ch for ch in action if ch.isalnum() or ch in "-_")[:40] or "approve"
    response = client.post(
        f"/console/orders/{order.public_id}/{safe_action}/",
        {"reason": reason, "from_lot": extra, "to_lot": extra, "days": extra, "hours_lost": extra, "credit": extra},
    )
    assert response.status_code in OK | {403}


# Large bodies: one value built by repeating a hostile unit up to the body limit (the shapes that make patterns
# backtrack: runs of spaces after `<`, opening brackets, key prefixes), the other fields nasty as above.
BODY_LIMIT = django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE
LARGE_EXAMPLES = 300
# What a hostile body may cost, whatever its length (the 80,000 spaces took 30 s in one pattern):
LONGEST_FIELD = max(  # the text a pattern may search: the longest value any customer form accepts (the SSH keys)
    getattr(field, "max_length", None) or 0
    for form in vars(customer_forms).values()
    if isinstance(form, type) and issubclass(form, customer_forms.forms.BaseForm)
    for field in form.base_fields.values()
)
QUERY_BUDGET = 40  # a valid booking makes 22; a query per line or character of a value would make thousands
hostile_unit = st.one_of(
    st.sampled_from(
        [" ", "<", "< ", "</ ", "<!", "\t", "\n", "&#", "a", "1", "é", "💥", "\x00", "ssh-ed25519 ", "AAAA", "="]
    ),
    st.text(min_size=1, max_size=8),
)
large_text = st.builds(
    lambda head, unit, count, tail: (head + unit * count)[: BODY_LIMIT + 1024] + tail,
    st.sampled_from(["", "<", "< /", "ssh-ed25519 AAAA", "0x"]),
    hostile_unit,
    st.integers(min_value=1, max_value=BODY_LIMIT),
    st.sampled_from(["", "1", "a", ">"]),
)
LARGE = settings(
    max_examples=LARGE_EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
LARGE_TARGETS = ["book", "book-quote", "resend", "tx-hint", "asset", "console", "split-trial", "sign-in", "language"]


@LARGE
@given(
    endpoint=st.sampled_from(LARGE_TARGETS),
    field=st.sampled_from(BOOKING_FIELDS),
    value=large_text,
    others=st.dictionaries(st.sampled_from(BOOKING_FIELDS), nasty_text, max_size=4),
)
@example(endpoint="book", field="notes", value="<" + " " * 80_000 + "1", others={})  # issue 13: 30 s, then a 500
@example(endpoint="book", field="notes", value="<" + " " * (BODY_LIMIT - 8192) + "1", others={})
def test_large_hostile_bodies_are_answered_at_the_cost_their_limits_allow(
    client, catalog, booking_data, django_user_model, body_reads, pattern_reads, endpoint, field, value, others
):
    """Any field of any form, up to the body limit: an answer (never a server error); over the limit, nothing of the
    body read; under it, no pattern searching more than the longest value a form accepts (the report's size for an
    upload), and a bounded number of queries."""
    order = Order.objects.first()
    if order is None:
        order, token = place(client, booking_data())
        test_large_hostile_bodies_are_answered_at_the_cost_their_limits_allow.token = token
    kwargs = {
        "public_id": order.public_id,
        "token": test_large_hostile_bodies_are_answered_at_the_cost_their_limits_allow.token,
    }
    if endpoint == "console":
        operator = django_user_model.objects.filter(username="olga").first()
        if operator is None:
            operator = django_user_model.objects.create_user("olga", password="a-long-password-here", is_staff=True)
            operator.user_permissions.add(Permission.objects.get(codename="operate_orders"))
        client.force_login(operator)
    requests = {
        "book": lambda: client.post(reverse("customer:book"), {**booking_data(), **others, field: value}),
        "book-quote": lambda: client.post(reverse("customer:book"), {**others, field: value, "action": "quote"}),
        "resend": lambda: client.post(reverse("customer:resend-link"), {"email": value}),
        "tx-hint": lambda: client.post(reverse("customer:order-paid", kwargs=kwargs), {"tx_hint": value}),
        "asset": lambda: client.post(reverse("customer:order-asset", kwargs=kwargs), {"asset": value}),
        "console": lambda: client.post(f"/console/orders/{order.public_id}/reject/", {"reason": value}),
        "sign-in": lambda: client.post(reverse("admin:login"), {"username": value, "password": value}),
        "language": lambda: client.post(reverse("set_language"), {"language": value[:8], "next": value}),
        "split-trial": lambda: client.post(
            reverse("customer:order-split-trial", kwargs=kwargs),
            {"report": SimpleUploadedFile("report.json", value.encode("utf-8", "surrogatepass"))},
        ),
    }
    body_reads.clear()
    pattern_reads.clear()
    with CaptureQueriesContext(connection) as queries:
        status = requests[endpoint]().status_code
    read = status != 413  # under the body limit: the forms saw it
    # Steer generation towards the largest values the forms still read, right under the body limit.
    target(float(len(value)) if read else 0.0, label="length of a value the forms read")
    event(
        f"{'read' if read else 'refused unread (413)'}: {len(value) // 65536 * 64}-{len(value) // 65536 * 64 + 64} KiB"
    )
    assert status in OK | {403}
    assert read or sum(body_reads) == 0, (endpoint, field, len(value), sum(body_reads))
    searched = split_trial_report.MAX_BYTES if endpoint == "split-trial" else LONGEST_FIELD
    assert pattern_reads.longest() <= searched, (endpoint, field, len(value), pattern_reads.by_pattern())
    assert len(queries) <= QUERY_BUDGET, (endpoint, field, len(value), len(queries))
