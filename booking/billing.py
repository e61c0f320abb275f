"""Who an order's fiscal invoice is made out to: the billing details asked at booking (organisation, address,
country, VAT number and purchase-order reference, the last two optional), checked and normalised here, and their
change from the order page. Payments refuses the change once the invoice is issued (`payments/fiscal.py`
`order_billing_change`, which locks the order and calls `order_billing_set`): an issued invoice never changes.

A VAT number is checked as the tax administrations write it: an EU number by its country's format and check digits
(python-stdnum, the library factur-x already brings), and its prefix must be the billing country's (Greece writes
EL); a number from outside the EU is only bounded (letters and digits). The portal does not ask VIES whether the
number is registered (no network from the payment path): the operator may, before relying on a reverse charge.
"""

import re
from dataclasses import dataclass

from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from stdnum.eu import vat as eu_vat

from booking.models import Order, OrderEvent
from booking.rules import BookingError

# ISO 3166-1 alpha-2, the officially assigned codes.
COUNTRIES = frozenset(
    re.findall(
        r"[A-Z]{2}",
        """
    AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS BT BV BW BY BZ CA
    CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM DO DZ EC EE EG EH ER ES ET FI FJ FK FM FO FR GA GB
    GD GE GF GG GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP KE KG
    KH KI KM KN KP KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS MT MU MV
    MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO RS RU RW SA SB
    SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW TZ UA UG UM US
    UY UZ VA VC VE VG VI VN VU WF WS YE YT ZA ZM ZW
    """,
    )
)
# The member states of the European Union (VAT area): their buyers' VAT numbers decide the reverse charge.
EU_COUNTRIES = frozenset(
    re.findall(r"[A-Z]{2}", "AT BE BG CY CZ DE DK EE ES FI FR GR HR HU IE IT LT LU LV MT NL PL PT RO SE SI SK")
)
# The prefix of a VAT number where it differs from the ISO code of the country.
VAT_PREFIX = {"GR": "EL"}

ADDRESS_MAX_LENGTH = 500
ADDRESS_MAX_LINES = 6
_MARKUP = re.compile(r"<\s*+[/!?]?\s*+[a-zA-Z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f]")
# What XML 1.0 cannot hold (the invoice's Factur-X XML, so the invoice could never be printed): C0 controls but tab
# and newlines, lone surrogates, U+FFFE and U+FFFF; and with them the other Unicode noncharacters and the C1
# controls, which no billing detail or message needs.
_NOT_PRINTABLE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufdd0-\ufdef\ufffe\uffff"
    + "".join(f"{chr(plane << 16 | 0xFFFE)}{chr(plane << 16 | 0xFFFF)}" for plane in range(1, 17))
    + "]"
)
_VAT_SEPARATORS = re.compile(r"[\s.\-/]")
_FOREIGN_VAT = re.compile(r"[A-Z0-9]{4,20}")
_PURCHASE_ORDER = re.compile(r"[\w .,:;/#()+&'’-]*")


NOT_PRINTABLE_MESSAGE = gettext_lazy(
    "This contains invisible or reserved characters (such as U+FFFE) that cannot be printed: type it again as "
    "plain text."
)


def printable(value: str) -> bool:
    """Whether `value` holds only characters an invoice (its XML and its page) can print."""
    return not _NOT_PRINTABLE.search(value)


@dataclass(frozen=True)
class BillingDetails:
    organisation: str
    address: str
    country: str
    vat_number: str = ""
    purchase_order: str = ""

    @property
    def in_eu(self) -> bool:
        return self.country in EU_COUNTRIES


def billing_details_of(order: Order) -> BillingDetails:
    return BillingDetails(
        organisation=order.organisation,
        address=order.billing_address,
        country=order.billing_country,
        vat_number=order.vat_number,
        purchase_order=order.purchase_order,
    )


def _text(value: str, *, field: str, max_length: int, multiline: bool = False) -> str:
    value = value.replace("\r\n", "\n").strip()
    if len(value) > max_length:
        raise BookingError(
            _("Write at most %(limit)s characters here (you wrote %(length)s).")
            % {"limit": max_length, "length": len(value)},
            field=field,
        )
    if _MARKUP.search(value):
        raise BookingError(_("HTML tags are not accepted here."), field=field)
    if (_CONTROL if multiline else _CONTROL_OR_NEWLINE).search(value):
        raise BookingError(
            _("Control characters are not accepted.") if multiline else _("Write this on one line."), field=field
        )
    if not printable(value):
        raise BookingError(NOT_PRINTABLE_MESSAGE, field=field)
    return value


def billing_check(details: BillingDetails) -> BillingDetails:
    """The details as they will be printed on the invoice (trimmed, the country and VAT number in capitals), or a
    BookingError naming the field and saying what to change."""
    organisation = _text(details.organisation, field="organisation", max_length=200)
    if not organisation:
        raise BookingError(_("Give the organisation the invoice is made out to."), field="organisation")
    address = _text(details.address, field="billing_address", max_length=ADDRESS_MAX_LENGTH, multiline=True)
    lines = [line.strip() for line in address.split("\n") if line.strip()]
    if not lines:
        raise BookingError(_("Give the billing address: street, postcode and city."), field="billing_address")
    if len(lines) > ADDRESS_MAX_LINES:
        raise BookingError(
            _("Write the billing address on at most %(limit)s lines.") % {"limit": ADDRESS_MAX_LINES},
            field="billing_address",
        )
    country = details.country.strip().upper()
    if country not in COUNTRIES:
        raise BookingError(
            _("Give the country as its two-letter ISO code, e.g. FR, DE or US."), field="billing_country"
        )
    vat_number = _vat_number(details.vat_number, country=country)
    purchase_order = _text(details.purchase_order, field="purchase_order", max_length=64)
    if not _PURCHASE_ORDER.fullmatch(purchase_order):
        raise BookingError(
            _("Write the purchase-order reference with letters, digits and simple punctuation only."),
            field="purchase_order",
        )
    return BillingDetails(
        organisation=organisation,
        address="\n".join(lines),
        country=country,
        vat_number=vat_number,
        purchase_order=purchase_order,
    )


def _vat_number(value: str, *, country: str) -> str:
    if len(value) > 40:
        raise BookingError(_("A VAT number is at most 20 letters and digits."), field="vat_number")
    compact = _VAT_SEPARATORS.sub("", value).upper()
    if not compact:
        return ""
    if not _FOREIGN_VAT.fullmatch(compact):
        raise BookingError(
            _("Write the VAT number with its country prefix, letters and digits only, e.g. FR40303265045."),
            field="vat_number",
        )
    if country not in EU_COUNTRIES:
        return compact
    prefix = VAT_PREFIX.get(country, country)
    if not compact.startswith(prefix):
        raise BookingError(
            _("A VAT number of %(country)s starts with %(prefix)s: check the number or the billing country.")
            % {"country": country, "prefix": prefix},
            field="vat_number",
        )
    if not eu_vat.is_valid(compact):
        raise BookingError(
            _("This is not a valid VAT number of %(country)s: its format or check digits are wrong.")
            % {"country": country},
            field="vat_number",
        )
    return compact


def order_billing_set(*, order: Order, billing: BillingDetails, actor_kind: str = OrderEvent.Actor.CUSTOMER) -> bool:
    """Write checked billing details on a locked order (payments' `order_billing_change` holds the lock and refuses
    once the invoice is issued). False when nothing changed."""
    billing = billing_check(billing)
    if billing == billing_details_of(order):
        return False
    order.organisation = billing.organisation
    order.billing_address = billing.address
    order.billing_country = billing.country
    order.vat_number = billing.vat_number
    order.purchase_order = billing.purchase_order
    order.save(
        update_fields=[
            "organisation",
            "billing_address",
            "billing_country",
            "vat_number",
            "purchase_order",
            "updated_at",
        ]
    )
    OrderEvent.objects.create(
        order=order,
        from_status=order.status,
        to_status=order.status,
        actor_kind=actor_kind,
        reason="billing details changed",
        evidence={"country": billing.country, "vat_number": billing.vat_number},
    )
    return True
