"""Bad input on every field of the booking form: a clear message in the researcher's language (English and
French), nothing saved, never a server error."""

import html
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext

from booking import selectors
from booking.models import Allocation, BookingPolicy, Order, OrderAccessToken, OrderEvent, OrderSshKey

pytestmark = pytest.mark.django_db


def _rsa_2048() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def ours(msgid: str, **params):
    """One of Binôme's own messages: its French translation must exist and be shown to French readers."""

    def expected(language: str) -> str:
        with translation.override(language):
            text = gettext(msgid)
        if language == "fr":
            assert text != msgid, f"no French translation for {msgid!r}"
        return text % params if params else text

    return expected


def pair(english: str, french: str):
    """A message of Django's own forms, with the words each language shows."""
    return lambda language: french if language == "fr" else english


LINE_1 = pair("Line 1: ", "Ligne 1\u00a0: ")
REQUIRED = pair("This field is required.", "Ce champ est obligatoire.")
MARKUP = ours("HTML tags are not accepted here.")
SCRIPT = "<script>alert('x')</script>"
HUGE = "x" * 100_000


def _earliest() -> str:
    return selectors.earliest_start_date(policy=BookingPolicy.current()).isoformat()


CASES = [
    # field, value, expected message
    ("hardware_class", "", REQUIRED),
    ("hardware_class", "gtx-1080", ours("Choose one of the hardware classes on offer.")),
    ("hardware_class", SCRIPT, ours("Choose one of the hardware classes on offer.")),
    ("hardware_class", HUGE, ours("Choose one of the hardware classes on offer.")),
    ("environment", "", REQUIRED),
    ("environment", "tensorflow-1", ours("Choose one of the environment images on offer.")),
    (
        "environment",
        "pytorch-2-6-rocm-6-4",
        ours(
            "%(image)s is a %(runtime)s image; %(hardware)s needs %(needed)s.",
            image="PyTorch 2.6 · ROCm 6.4",
            runtime="ROCm",
            hardware="NVIDIA B200 pair",
            needed="CUDA",
        ),
    ),
    (
        "environment",
        "pytorch-2-4-cuda-12-4",
        ours(
            "%(image)s ships %(runtime)s %(version)s, which does not target %(arch)s: "
            "%(hardware)s needs %(runtime)s %(minimum)s or newer.",
            image="PyTorch 2.4 · CUDA 12.4",
            runtime="CUDA",
            version="12.4",
            arch="sm_100",
            hardware="NVIDIA B200 pair",
            minimum="12.8",
        ),
    ),
    ("lots", "", REQUIRED),
    ("lots", "0", pair("greater than or equal to 1", "supérieure ou égale à 1")),
    ("lots", "-3", pair("greater than or equal to 1", "supérieure ou égale à 1")),
    ("lots", "two", ours("Give the number of lots as a whole number, e.g. 2.")),
    ("lots", "2.5", ours("Give the number of lots as a whole number, e.g. 2.")),
    ("lots", "9" * 40, ours("At most %(limit_value)s lots can be booked in one order.", limit_value=8)),
    ("lots", "9", ours("At most %(limit_value)s lots can be booked in one order.", limit_value=8)),
    ("lots", "7", pair("Only 6 lots of NVIDIA B200 pair exist.", "Il n’existe que 6 lots de NVIDIA B200 pair.")),
    ("start_date", "", ours("Give the start date, or tick “start as soon as ready”.")),
    ("start_date", "next tuesday", ours("Give the start date as YYYY-MM-DD.")),
    ("start_date", "2027-02-30", ours("Give the start date as YYYY-MM-DD.")),
    ("start_date", SCRIPT, ours("Give the start date as YYYY-MM-DD.")),
    ("start_date", "2020-01-01", "past"),
    ("start_date", "2999-01-01", "beyond-horizon"),
    ("days", "", REQUIRED),
    ("days", "5", ours("Choose a window of 3, 7 or 30 days.")),
    ("days", "seven", ours("Choose a window of 3, 7 or 30 days.")),
    ("contact_name", "", REQUIRED),
    ("contact_name", "   ", REQUIRED),
    ("contact_name", "x" * 121, pair("at most 120 characters", "au plus 120 caractères")),
    ("contact_name", SCRIPT, MARKUP),
    ("contact_name", "Ada\nLovelace", ours("Write this on one line.")),
    (
        "contact_name",
        "Ada\x00Lovelace",
        pair("Null characters are not allowed.", "Le caractère nul n’est pas autorisé."),
    ),
    ("contact_email", "", REQUIRED),
    (
        "contact_email",
        "ada-at-example.org",
        pair("Enter a valid email address.", "Saisissez une adresse de courriel valide."),
    ),
    (
        "contact_email",
        f"ada@example.org{SCRIPT}",
        pair("Enter a valid email address.", "Saisissez une adresse de courriel valide."),
    ),
    ("organisation", "", REQUIRED),
    ("organisation", "<b>Lab</b>", MARKUP),
    ("organisation", HUGE, pair("at most 200 characters", "au plus 200 caractères")),
    ("messenger", "<img src=x onerror=alert(1)>", MARKUP),
    ("messenger", "m" * 101, pair("at most 100 characters", "au plus 100 caractères")),
    ("ssh_keys", "", REQUIRED),
    ("ssh_keys", "ssh-ed25519 not-base64!!", LINE_1),
    ("ssh_keys", "rsa", "ssh-rsa-2048"),
    (
        "ssh_keys",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
        "private",
    ),
    ("ssh_keys", SCRIPT, LINE_1),
    ("sharing", "", REQUIRED),
    ("sharing", "the_whole_360_gb", ours("Choose what the two cards will share.")),
    ("hypothesis", "", REQUIRED),
    ("hypothesis", "world_domination", ours("Choose one of the hypotheses listed.")),
    ("hypothesis_detail", SCRIPT, MARKUP),
    ("hypothesis_detail", "h" * 2001, pair("at most 2000 characters", "au plus 2000 caractères")),
    ("hypothesis_detail", "", ours("Describe your hypothesis in a few words.")),
    ("hypothesis_detail", "   \n ", ours("Describe your hypothesis in a few words.")),
    ("hypothesis_measure", "", ours("Say which measure would confirm your hypothesis.")),
    ("hypothesis_measure", "  ", ours("Say which measure would confirm your hypothesis.")),
    ("hypothesis_measure", SCRIPT, MARKUP),
    ("hypothesis_measure", "m" * 1001, pair("at most 1000 characters", "au plus 1000 caractères")),
    ("billing_address", "", ours("Give the billing address: street, postcode and city.")),
    ("billing_address", " \n \n", ours("Give the billing address: street, postcode and city.")),
    ("billing_address", SCRIPT, MARKUP),
    ("billing_address", "line\n" * 7, ours("Write the billing address on at most %(limit)s lines.", limit=6)),
    ("billing_address", "a" * 501, pair("at most 500 characters", "au plus 500 caractères")),
    ("billing_country", "", ours("Give the country as its two-letter ISO code, e.g. FR, DE or US.")),
    ("billing_country", "ZZ", ours("Give the country as its two-letter ISO code, e.g. FR, DE or US.")),
    ("billing_country", "France", ours("Give the country as its two-letter ISO code, e.g. FR, DE or US.")),
    ("billing_country", HUGE, pair("at most 40 characters", "au plus 40 caractères")),
    (
        "vat_number",
        "FR40303265046",
        ours("This is not a valid VAT number of %(country)s: its format or check digits are wrong.", country="FR"),
    ),
    (
        "vat_number",
        "DE136695976",
        ours(
            "A VAT number of %(country)s starts with %(prefix)s: check the number or the billing country.",
            country="FR",
            prefix="FR",
        ),
    ),
    (
        "vat_number",
        "FR40;DROP TABLE",
        ours("Write the VAT number with its country prefix, letters and digits only, e.g. FR40303265045."),
    ),
    ("vat_number", "FR40\n303265045", ours("Write this on one line.")),
    ("purchase_order", "PO-1\nPO-2", ours("Write this on one line.")),
    (
        "purchase_order",
        "PO{1}$",
        ours("Write the purchase-order reference with letters, digits and simple punctuation only."),
    ),
    ("notes", "<iframe src=//evil>", MARKUP),
    ("notes", "n" * 4001, pair("at most 4000 characters", "au plus 4000 caractères")),
]


def _expected(expectation, language: str, field: str, value: str) -> str:
    policy = BookingPolicy.current()
    if expectation == "past":
        return ours("The earliest start is %(date)s (windows start at 00:00 UTC).", date=_earliest())(language)
    if expectation == "beyond-horizon":
        latest = selectors.latest_start_date(policy=policy).isoformat()
        return ours(
            "Bookings open %(days)d days ahead: the latest start is %(date)s.", days=policy.horizon_days, date=latest
        )(language)
    if expectation == "ssh-rsa-2048":
        return pair("is too short: at least 3072 bits are required", "trop courte")(language)
    if expectation == "private":
        return LINE_1(language) + ("This is a private key" if language == "en" else "Ceci est une clé privée")
    return expectation(language)


def _assert_nothing_saved() -> None:
    assert Order.objects.count() == 0
    assert Allocation.objects.count() == 0
    assert OrderEvent.objects.count() == 0
    assert OrderSshKey.objects.count() == 0
    assert OrderAccessToken.objects.count() == 0


@pytest.mark.parametrize("language", ["en", "fr"])
@pytest.mark.parametrize(("field", "value", "expectation"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_value_gets_a_clear_message_in_the_readers_language_and_nothing_is_saved(
    client, catalog, booking_data, language, field, value, expectation
):
    if expectation == "ssh-rsa-2048":
        value = _rsa_2048()
    client.cookies["django_language"] = language

    response = client.post(reverse("customer:book"), booking_data(**{field: value}))

    assert response.status_code == 200
    page = html.unescape(response.content.decode())
    expected = _expected(expectation, language, field, value)
    assert expected in page, f"{expected!r} not shown for {field}={value[:40]!r}"
    assert '<p class="error" role="alert">' in page or 'class="alert alert-error"' in page
    assert "<script>alert" not in response.content.decode()  # echoed input is escaped
    _assert_nothing_saved()


CAMPAIGN_CASES = [
    # the 30-day plan's fields, and the message the researcher reads
    ({"checkpoint_interval_hours": "", "stop_criteria": "Loss flat for 3 days."}, "interval"),
    ({"checkpoint_interval_hours": "6", "stop_criteria": ""}, "stop"),
    ({"checkpoint_interval_hours": "6", "stop_criteria": "  "}, "stop"),
    ({"checkpoint_interval_hours": "0", "stop_criteria": "Loss flat."}, "bounds"),
    ({"checkpoint_interval_hours": "25", "stop_criteria": "Loss flat."}, "bounds"),
    ({"checkpoint_interval_hours": "six", "stop_criteria": "Loss flat."}, "whole"),
    ({"checkpoint_interval_hours": "6", "stop_criteria": SCRIPT}, "markup"),
]


@pytest.mark.parametrize("language", ["en", "fr"])
@pytest.mark.parametrize(("plan", "expectation"), CAMPAIGN_CASES)
def test_a_30_day_campaign_needs_its_checkpoint_interval_and_stop_criteria(
    client, catalog, booking_data, language, plan, expectation
):
    client.cookies["django_language"] = language

    response = client.post(reverse("customer:book"), booking_data(days="30", **plan))

    assert response.status_code == 200
    page = html.unescape(response.content.decode())
    expected = {
        "interval": ours("A 30-day campaign checkpoints regularly: give the interval."),
        "stop": ours("A 30-day campaign needs its stop criteria: say when you would stop it early."),
        "bounds": pair("Ensure this value is", "Assurez-vous que cette valeur est"),
        "whole": ours("Give the checkpoint interval as a whole number of hours, e.g. 6."),
        "markup": MARKUP,
    }[expectation](language)
    assert expected in page
    _assert_nothing_saved()


def test_a_30_day_campaign_keeps_its_plan_and_a_shorter_window_keeps_none(client, catalog, booking_data):
    plan = {"checkpoint_interval_hours": "6", "stop_criteria": "Validation loss flat for 3 days."}

    campaign = client.post(reverse("customer:book"), booking_data(days="30", contact_email="a@example.org", **plan))
    week = client.post(reverse("customer:book"), booking_data(days="7", contact_email="b@example.org", **plan))

    assert campaign.status_code == week.status_code == 302
    thirty = Order.objects.get(contact_email="a@example.org")
    seven = Order.objects.get(contact_email="b@example.org")
    assert (thirty.checkpoint_interval_hours, thirty.stop_criteria) == (6, "Validation loss flat for 3 days.")
    assert (seven.checkpoint_interval_hours, seven.stop_criteria) == (None, "")
    page = client.get(campaign["Location"]).content.decode()
    assert "A checkpoint every 6 hours" in page and "Validation loss flat for 3 days." in page


def test_a_post_with_no_fields_at_all_lists_what_is_missing(client, catalog):
    response = client.post(reverse("customer:book"), {})

    assert response.status_code == 200
    assert response.content.decode().count("This field is required.") >= 8
    _assert_nothing_saved()


def test_repeated_fields_and_a_json_body_are_refused_calmly(client, catalog, booking_data):
    data = booking_data()
    data["lots"] = ["1", "5000"]
    assert client.post(reverse("customer:book"), data).status_code in {200, 302}
    response = client.post(reverse("customer:book"), data='{"lots": 1}', content_type="application/json")
    assert response.status_code == 200 and "This field is required." in response.content.decode()


def test_an_oversized_body_is_a_413_not_a_500(client, catalog, booking_data):
    response = client.post(reverse("customer:book"), booking_data(notes="n" * 3_000_000))

    assert response.status_code == 413
    _assert_nothing_saved()


@pytest.mark.parametrize(
    "params",
    [
        {"hardware_class": SCRIPT, "lots": "abc", "start_date": "x", "days": "99", "environment": HUGE},
        {"hardware_class": "b200-pair", "lots": "-1", "start_date": "1999-01-01", "days": "3"},
        {"hardware_class": "b200-pair", "lots": "9" * 50, "start_date": "9999-12-31", "days": "30"},
        {"hardware_class": "b200-pair", "start_date": "2027-02-29"},
    ],
)
def test_the_live_quote_survives_hostile_parameters(client, catalog, params):
    for headers in ({}, {"HX-Request": "true"}):
        response = client.get(reverse("customer:book"), params, headers=headers)
        assert response.status_code == 200
        assert "<script>alert" not in response.content.decode()


def test_far_dates_in_the_quote_are_explained_not_crashed(client, catalog, policy):
    start = selectors.latest_start_date(policy=policy) + timedelta(days=1)
    response = client.get(
        reverse("customer:book"),
        {
            "hardware_class": "b200-pair",
            "environment": "pytorch-2-7-cuda-12-8",
            "lots": "1",
            "days": "7",
            "start_date": start.isoformat(),
        },
        headers={"HX-Request": "true"},
    )
    assert "Bookings open 180 days ahead" in response.content.decode()
