"""The fiscal invoice (facture): the numbered document a settled payment issues, distinct from `Invoice`, which is
the payment request (deposit address, amount due). Imported by payments/models.py.

An issued document never changes: its figures are written once, in the settling transaction, with a number taken
from the year's counter (gapless: the counter row is locked and moves in that transaction, so a rollback gives the
number back); its PDF/A-3 is written once after the commit, with its SHA-256, and never regenerated.
"""

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from infrastructure.singleton import SingletonRow


class InvoicingSettings(SingletonRow, models.Model):
    """The seller's identity printed on every invoice and the VAT rate, set by the operator (one row, pk=1). The
    legal notice of the terms (booking.TermsVersion) is prose for people; an invoice needs these as fields."""

    seller_name = models.CharField(_("seller's legal name"), max_length=200, default="Binôme demo operator")
    seller_address = models.TextField(_("seller's address"), max_length=500, default="1 rue de l'Exemple\n75001 Paris")
    seller_country = models.CharField(_("seller's country (ISO code)"), max_length=2, default="FR")
    seller_vat_number = models.CharField(_("seller's VAT number"), max_length=20, default="FR40303265045")
    seller_registration = models.CharField(
        _("seller's registration"),
        max_length=120,
        blank=True,
        default="SIREN 303 265 045, RCS Paris",
        help_text=_("Company register and number (in France: SIREN, RCS), printed on the invoice."),
    )
    legal_mentions = models.TextField(
        _("other legal mentions"),
        blank=True,
        default="",
        help_text=_("Printed at the foot of every invoice, e.g. the legal form and share capital."),
    )
    vat_rate_percent = models.DecimalField(
        _("VAT rate (%)"),
        max_digits=5,
        decimal_places=2,
        default=Decimal("20.00"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("100"))],
        help_text=_(
            "The rate included in the prices where VAT is due (buyers in the seller's country, and EU buyers "
            "without a VAT number). Reverse-charge and non-EU buyers pay the same price with no VAT in it. A new "
            "rate applies to the invoices issued after the change; issued ones, and the credit notes that correct "
            "them, keep the rate they were issued at."
        ),
    )
    number_prefix = models.CharField(
        _("invoice number prefix"),
        max_length=8,
        default="F",
        help_text=_(
            "Invoice numbers read PREFIX-YEAR-SEQUENCE, e.g. F-2026-000042. Each prefix numbers its own documents "
            "from 1 each year, without gaps: a new prefix starts a new series, and issued documents keep theirs."
        ),
    )

    class Meta:
        verbose_name = _("invoicing settings")
        verbose_name_plural = _("invoicing settings")
        constraints = [
            models.CheckConstraint(condition=Q(pk=1), name="invoicing_settings_single_row"),
            models.CheckConstraint(
                condition=Q(vat_rate_percent__gte=0, vat_rate_percent__lte=100), name="invoicing_vat_rate_bounds"
            ),
        ]

    def __str__(self) -> str:
        return str(_("Invoicing settings"))


class InvoicingSettingsChange(models.Model):
    """One change of the invoicing settings as the operator saved it: when, by whom, each field's value before and
    after. The issued documents keep what was set when they were issued (their own copy); this says when each
    setting was in force."""

    changed_at = models.DateTimeField(_("changed"))
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("changed by"),
    )
    changes = models.JSONField(_("changes"))  # {field: [before, after]}, as text

    class Meta:
        ordering = ["-changed_at", "-pk"]
        verbose_name = _("invoicing settings change")
        verbose_name_plural = _("invoicing settings history")

    def __str__(self) -> str:
        return f"{self.changed_at:%Y-%m-%d %H:%M} {', '.join(self.changes)}"


class FiscalInvoiceSeries(models.Model):
    """The last number issued under a prefix in a year: each prefix the operator has used numbers its own documents
    from 1 each year, without gaps (a new prefix starts a new series; going back to an earlier one continues it).
    Locked (`select_for_update`) by the transaction that takes the next number, so two settlements never take one
    number and a rolled-back one leaves no gap."""

    prefix = models.CharField(_("number prefix"), max_length=8)
    year = models.PositiveSmallIntegerField(_("year"))
    last_sequence = models.PositiveIntegerField(_("last number issued"), default=0)

    class Meta:
        ordering = ["-year", "prefix"]
        verbose_name = _("invoice number series")
        verbose_name_plural = _("invoice number series")
        constraints = [models.UniqueConstraint(fields=["prefix", "year"], name="fiscal_invoice_series_once")]

    def __str__(self) -> str:
        return f"{self.prefix}-{self.year}: {self.last_sequence}"


class FiscalInvoicePublished(Exception):
    """An issued fiscal invoice was about to change or disappear."""


class FiscalInvoice(models.Model):
    """The invoice a lab files: one per settled payment request, numbered PREFIX-YEAR-SEQUENCE without gaps in the
    series of its prefix and year; or a credit note that corrects one (a refund owed), numbered in the same series
    as the invoices issued with it."""

    class Kind(models.TextChoices):
        INVOICE = "invoice", _("Invoice")
        CREDIT_NOTE = "credit_note", _("Credit note")

    class VatCategory(models.TextChoices):
        """EN 16931 VAT category codes (UNTDID 5305) the portal uses."""

        STANDARD = "S", _("VAT due")
        REVERSE_CHARGE = "AE", _("Reverse charge")
        OUTSIDE_EU = "G", _("Outside the EU")

    kind = models.CharField(_("kind"), max_length=12, choices=Kind.choices, default=Kind.INVOICE)
    number = models.CharField(_("invoice number"), max_length=32, unique=True)
    prefix = models.CharField(_("number prefix"), max_length=8)  # the prefix set when it was issued
    year = models.PositiveSmallIntegerField()
    sequence = models.PositiveIntegerField()
    order = models.ForeignKey("booking.Order", on_delete=models.PROTECT, related_name="fiscal_invoices")
    # An invoice's payment request (a credit note has none: it names the invoice it corrects, and why).
    payment = models.OneToOneField(
        "payments.Invoice", on_delete=models.PROTECT, related_name="fiscal_invoice", null=True, blank=True
    )
    corrects = models.ForeignKey(
        "self", on_delete=models.PROTECT, related_name="credit_notes", null=True, blank=True, verbose_name=_("corrects")
    )
    reason = models.TextField(_("reason"), blank=True)
    issued_at = models.DateTimeField(_("issued"))
    language = models.CharField(max_length=8, default="en")

    # Snapshots: the invoice says what was true when it was issued, whatever is edited later.
    seller = models.JSONField()  # name, address, country, vat_number, registration, legal_mentions
    buyer = models.JSONField()  # organisation, contact_name, email, address, country, vat_number, purchase_order
    lines = models.JSONField()  # [{description, quantity, unit_price_gross, amount_gross}] as strings

    currency = models.CharField(max_length=3)
    vat_category = models.CharField(max_length=2, choices=VatCategory.choices)
    vat_rate = models.DecimalField(max_digits=5, decimal_places=2)
    vat_mention = models.TextField(blank=True)
    total_net = models.DecimalField(_("total excluding VAT"), max_digits=14, decimal_places=2)
    vat_amount = models.DecimalField(_("VAT"), max_digits=14, decimal_places=2)
    total_gross = models.DecimalField(_("total including VAT"), max_digits=14, decimal_places=2)

    # The payment, as the chain showed it.
    payment_chain_id = models.PositiveBigIntegerField()
    payment_asset = models.CharField(max_length=12)
    payment_amount = models.CharField(max_length=100)  # the whole-coin amount, exactly (units / 10**decimals)
    payment_tx_hashes = models.JSONField(default=list)
    payment_rate = models.DecimalField(max_digits=30, decimal_places=10)
    payment_rate_source = models.CharField(max_length=120)
    paid_at = models.DateTimeField()

    # The PDF/A-3 with its Factur-X XML, written once after the commit (payments/fiscal_documents.py).
    pdf = models.BinaryField(editable=False, default=b"")
    pdf_sha256 = models.CharField(max_length=64, blank=True, editable=False)
    pdf_written_at = models.DateTimeField(null=True, blank=True, editable=False)
    emailed_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-year", "-sequence"]
        verbose_name = _("fiscal invoice")
        verbose_name_plural = _("fiscal invoices")
        constraints = [
            models.UniqueConstraint(fields=["prefix", "year", "sequence"], name="fiscal_invoice_number_once_a_series"),
            models.CheckConstraint(condition=Q(sequence__gte=1), name="fiscal_invoice_sequence_positive"),
            models.CheckConstraint(
                condition=Q(total_gross=F("total_net") + F("vat_amount")), name="fiscal_invoice_totals_add_up"
            ),
            models.CheckConstraint(
                condition=Q(vat_category__in=["S", "AE", "G"]), name="fiscal_invoice_vat_category_known"
            ),
            models.CheckConstraint(
                condition=Q(kind="invoice", payment__isnull=False, corrects__isnull=True)
                | Q(kind="credit_note", payment__isnull=True, corrects__isnull=False),
                name="fiscal_invoice_pays_or_corrects",
            ),
            models.CheckConstraint(condition=Q(total_gross__gt=0), name="fiscal_invoice_total_positive"),
        ]

    def __str__(self) -> str:
        return self.number

    def save(self, *args, **kwargs) -> None:
        # Written once: the PDF is added by one conditional UPDATE (payments/fiscal_documents.py), never by save().
        if self.pk is not None and FiscalInvoice.objects.filter(pk=self.pk).exists():
            raise FiscalInvoicePublished(f"fiscal invoice {self.number} is issued and cannot change")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise FiscalInvoicePublished(f"fiscal invoice {self.number} is issued and cannot be deleted")

    @property
    def payment_rate_text(self) -> str:
        """The rate as the quote had it, without the column's trailing zeros."""
        return f"{self.payment_rate.normalize():f}"

    @property
    def is_credit_note(self) -> bool:
        return self.kind == self.Kind.CREDIT_NOTE

    @property
    def filename(self) -> str:
        return f"{'credit-note' if self.is_credit_note else 'invoice'}-{self.number}.pdf"


class FiscalDocumentFailure(models.Model):
    """An issued invoice whose document could not be printed for a reason that printing again does not cure (its
    XML or the schema refused what it holds): recorded once, so that beat's sweep stops queueing it (it would fill
    the sweep's batch for ever and starve the others) and the operator sees it. Deleting the row, once the cause is
    fixed, lets the sweep print it again."""

    fiscal_invoice = models.OneToOneField(
        FiscalInvoice, on_delete=models.CASCADE, related_name="document_failure", verbose_name=_("fiscal invoice")
    )
    failed_at = models.DateTimeField(_("failed"))
    error = models.TextField(_("error"))

    class Meta:
        ordering = ["-failed_at"]
        verbose_name = _("unprintable fiscal document")
        verbose_name_plural = _("unprintable fiscal documents")

    def __str__(self) -> str:
        return str(self.fiscal_invoice)
