"""Invoices, what the chain showed (transfers), the scan cursors, operator-set rates.

On-chain amounts are integers in base units (DecimalField with no decimals: up to 78 digits, a uint256); fiat
amounts are Decimal. An invoice is watched until `monitor_until`, even after its quote expired.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from infrastructure.singleton import SingletonRow

UINT256_DIGITS = 78


class DerivationSlot(models.Model):
    """One row per deposit address ever handed out: its primary key is the child index, never reused."""

    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = _("derivation slot")

    def __str__(self) -> str:
        return f"m/…/0/{self.pk}"


class Invoice(models.Model):
    class Status(models.TextChoices):
        NEW = "new", _("Waiting for the transfer")
        PROCESSING = "processing", _("Transfer being confirmed")
        SETTLED = "settled", _("Paid")
        EXPIRED = "expired", _("Expired")
        INVALID = "invalid", _("Invalid")

    class TxHintOutcome(models.TextChoices):
        """What the portal read on chain for the transaction hash the customer pasted (payments/tx_hints.py)."""

        CHECKING = "checking", _("We are reading your transaction on chain.")
        NOT_FOUND = (
            "not_found",
            _("Your transaction is not on this network (yet). Check the hash and the network; we look again shortly."),
        )
        FAILED = "failed", _("Your transaction failed on chain: it paid nothing. Send the payment again.")
        ELSEWHERE = "elsewhere", _("Your transaction pays nothing to this invoice's address on this network.")
        CONFIRMING = "confirming", _("Your transaction was found: it counts once its block is confirmed.")
        CREDITED = "credited", _("Your transaction was found and counted toward this invoice.")

    class Purpose(models.TextChoices):
        ORDER = "order", _("Order")
        EXTENSION = "extension", _("Extension")

    order = models.ForeignKey("booking.Order", on_delete=models.PROTECT, related_name="invoices")
    purpose = models.CharField(max_length=16, choices=Purpose.choices, default=Purpose.ORDER)
    extension_days = models.PositiveSmallIntegerField(null=True, blank=True)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.NEW)

    chain_id = models.PositiveBigIntegerField(_("chain id"))
    asset_symbol = models.CharField(_("asset"), max_length=12)
    asset_contract = models.CharField(_("token contract"), max_length=42, blank=True)
    asset_decimals = models.PositiveSmallIntegerField()
    derivation_index = models.PositiveBigIntegerField(unique=True)
    deposit_address = models.CharField(_("deposit address"), max_length=42, unique=True)
    amount_due_units = models.DecimalField(_("amount due (base units)"), max_digits=UINT256_DIGITS, decimal_places=0)

    fiat_amount = models.DecimalField(_("price"), max_digits=14, decimal_places=2)
    fiat_currency = models.CharField(max_length=3)
    rate = models.DecimalField(_("rate (fiat per coin)"), max_digits=30, decimal_places=10)
    rate_source = models.CharField(_("rate source"), max_length=120)

    expires_at = models.DateTimeField(_("quote expires"))
    monitor_until = models.DateTimeField(_("watched until"))
    created_at = models.DateTimeField(auto_now_add=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    # What the chain says, recomputed by every scan from the Transfer rows.
    amount_confirmed_units = models.DecimalField(max_digits=UINT256_DIGITS, decimal_places=0, default=0)
    amount_pending_units = models.DecimalField(max_digits=UINT256_DIGITS, decimal_places=0, default=0)
    # When the balance was last reconciled with the credits (payments/balances.py): the native coin's (coin paid by
    # a contract has no transaction of its own to read), or the token's after "I've paid" (a transfer the scan's
    # log reading missed). "I've paid" clears it, to be read first.
    native_checked_at = models.DateTimeField(null=True, blank=True)

    # BTCPay Server's exception flags.
    paid_partial = models.BooleanField(_("partially paid"), default=False)
    paid_over = models.BooleanField(_("overpaid: refund the difference"), default=False)
    paid_late = models.BooleanField(_("paid after expiry"), default=False)
    needs_operator = models.BooleanField(_("needs an operator"), default=False)
    marked = models.BooleanField(_("marked paid by an admin"), default=False)
    marked_reason = models.TextField(blank=True)
    # What the chain showed (confirmed or seen pending) when an admin marked it paid: the transfer the mark may have
    # been for. What confirms beyond it came on top of the amount due paid by another route, and bought nothing
    # (payments/ledger.py). Null on invoices marked before it was recorded: their transfers count toward the mark.
    marked_chain_units = models.DecimalField(max_digits=UINT256_DIGITS, decimal_places=0, null=True, blank=True)
    marked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    # "I've paid": recorded first, then a check is asked for.
    customer_paid_at = models.DateTimeField(null=True, blank=True)
    customer_tx_hint = models.CharField(max_length=66, blank=True)
    customer_tx_outcome = models.CharField(max_length=16, choices=TxHintOutcome.choices, blank=True)
    check_requested_at = models.DateTimeField(null=True, blank=True)
    check_delayed_since = models.DateTimeField(null=True, blank=True)
    last_checked_at = models.DateTimeField(null=True, blank=True)
    last_seen_head = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("invoice")
        verbose_name_plural = _("invoices")
        constraints = [
            models.CheckConstraint(condition=Q(amount_due_units__gt=0), name="invoice_amount_positive"),
            models.CheckConstraint(condition=Q(expires_at__lte=models.F("monitor_until")), name="invoice_monitored"),
            models.CheckConstraint(
                condition=Q(status__in=["new", "processing", "settled", "expired", "invalid"]),
                name="invoice_status_known",
            ),
        ]
        indexes = [models.Index(fields=["chain_id", "status", "monitor_until"])]
        permissions = [("review_payments", "Can review payments: re-check on chain and mark paid")]

    def __str__(self) -> str:
        return f"{self.order_id} · {self.asset_symbol} · {self.deposit_address}"

    @property
    def amount_missing_units(self) -> int:
        return max(0, int(self.amount_due_units) - int(self.amount_confirmed_units))

    @property
    def amount_outstanding_units(self) -> int:
        """What remains to be sent once the transfers being confirmed count: what the page asks for."""
        return max(0, self.amount_missing_units - int(self.amount_pending_units))

    @property
    def is_open(self) -> bool:
        return self.status in (self.Status.NEW, self.Status.PROCESSING)


class Transfer(models.Model):
    """A credit seen on chain to a deposit address: an ERC-20 Transfer log, the native coin of a transaction
    (log_index -1), or native coin that no transaction explains, found by reconciling the balance.

    Credited once: (chain_id, tx_hash, log_index) is unique. Native credits found through balances have no
    transaction of their own: tx_hash is "balance:<address>:<block>" and log_index -1.
    """

    class Status(models.TextChoices):
        SEEN = "seen", _("Seen, confirming")
        CONFIRMED = "confirmed", _("Confirmed")
        REMOVED = "removed", _("Removed by a reorganisation")

    chain_id = models.PositiveBigIntegerField()
    tx_hash = models.CharField(max_length=120)
    log_index = models.BigIntegerField()
    block_number = models.PositiveBigIntegerField()
    block_hash = models.CharField(max_length=66)
    # The block's own timestamp, once read on its canonical block: lateness is judged by it, not by the scanner.
    block_time = models.DateTimeField(null=True, blank=True)
    token_contract = models.CharField(max_length=42, blank=True)
    from_address = models.CharField(max_length=42, blank=True)
    to_address = models.CharField(max_length=42)
    amount_units = models.DecimalField(max_digits=UINT256_DIGITS, decimal_places=0)
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, null=True, blank=True, related_name="transfers")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.SEEN)
    # The credit is not in the invoice's asset (another allow-listed token, or a token not allow-listed at all).
    wrong_asset = models.BooleanField(default=False)
    first_seen_at = models.DateTimeField(default=timezone.now)
    confirmed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["block_number", "log_index"]
        verbose_name = _("transfer")
        verbose_name_plural = _("transfers")
        constraints = [
            models.UniqueConstraint(fields=["chain_id", "tx_hash", "log_index"], name="transfer_credited_once"),
            models.CheckConstraint(condition=Q(amount_units__gte=0), name="transfer_amount_not_negative"),
        ]
        indexes = [models.Index(fields=["invoice", "status"])]

    def __str__(self) -> str:
        return f"{self.tx_hash}#{self.log_index}"


class ChainCursor(models.Model):
    """Where the scan of a chain stands: every block up to `confirmed_block` has been read at its final state, and
    every transfer in it is final or gone. It never moves backwards."""

    chain_id = models.PositiveBigIntegerField(unique=True)
    confirmed_block = models.PositiveBigIntegerField(default=0)
    head_block = models.PositiveBigIntegerField(default=0)
    last_scan_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    unavailable_since = models.DateTimeField(null=True, blank=True)
    # Logs that were not a well-formed transfer of an allow-listed token (or that the database refused): skipped.
    skipped_logs = models.PositiveBigIntegerField(default=0)
    # A scan holds the chain until then (renewed per committed batch): a second scan at the same moment skips.
    scan_lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("chain cursor")

    def __str__(self) -> str:
        return f"chain {self.chain_id} at {self.confirmed_block}"


class OperatorRate(models.Model):
    """A rate set by an operator, for an asset with neither a peg nor a rate feed: fiat per whole coin."""

    chain_id = models.PositiveBigIntegerField()
    asset_symbol = models.CharField(max_length=12)
    fiat_currency = models.CharField(max_length=3)
    rate = models.DecimalField(max_digits=30, decimal_places=10)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        verbose_name = _("operator rate")
        constraints = [
            models.UniqueConstraint(fields=["chain_id", "asset_symbol", "fiat_currency"], name="one_rate_per_asset"),
            models.CheckConstraint(condition=Q(rate__gt=0), name="rate_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.asset_symbol}@{self.chain_id} = {self.rate} {self.fiat_currency}"


class PaymentSettings(SingletonRow, models.Model):
    """Operator-set rules of payments. One row (pk=1), edited in the admin."""

    late_rate_tolerance_percent = models.DecimalField(
        _("late payments settle by themselves if the rate moved less than (%)"),
        max_digits=5,
        decimal_places=2,
        default=2,
        help_text=_(
            "A payment confirmed after its quote expired settles by itself only when its lots are still free and the "
            "asset's rate moved less than this since the quote; otherwise it waits for an operator."
        ),
    )

    class Meta:
        verbose_name = _("payment settings")
        verbose_name_plural = _("payment settings")
        constraints = [
            models.CheckConstraint(condition=Q(pk=1), name="payment_settings_single_row"),
            models.CheckConstraint(
                condition=Q(late_rate_tolerance_percent__gte=0), name="late_rate_tolerance_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return str(_("Payment settings"))


class Refund(models.Model):
    """Money owed back to a customer, in the asset and on the chain of the payment it refunds (BTCPay's pull
    payment): the customer gives an address, the operator pays it from their own wallet (the portal holds no key),
    and only a transaction read on chain (`RefundPayment`) moves it towards paid.

    The amount is fixed in base units when the refund is opened, at the original invoice's rate (see
    `payments/refunds.py` for the rounding), and never follows the market afterwards."""

    class Reason(models.TextChoices):
        CANCELLATION = "cancellation", _("Cancelled by the customer")
        REJECTION = "rejection", _("Not accepted by the operators")
        OVERPAYMENT = "overpayment", _("Paid more than the amount due")
        LATE_PAYMENT = "late_payment", _("Paid after the invoice was settled or the order closed")
        PROVIDER_FAULT = "provider_fault", _("Provider fault")
        EXTENSION_REFUSED = "extension_refused", _("Extension paid when it was no longer possible")
        # A part payment, a payment to a replaced quote or to an order closed meanwhile: it bought nothing.
        UNUSED_PAYMENT = "unused_payment", _("Paid for an order that could not take the payment")

    class Status(models.TextChoices):
        AWAITING_ADDRESS = "awaiting_address", _("Waiting for your refund address")
        DUE = "due", _("Refund being sent")
        PARTLY_PAID = "partly_paid", _("Partly refunded")
        PAID = "paid", _("Refunded")

    order = models.ForeignKey("booking.Order", on_delete=models.PROTECT, related_name="refunds")
    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="refunds")
    reason = models.CharField(_("reason"), max_length=20, choices=Reason.choices)
    status = models.CharField(_("status"), max_length=20, choices=Status.choices, default=Status.AWAITING_ADDRESS)

    chain_id = models.PositiveBigIntegerField(_("chain id"))
    asset_symbol = models.CharField(_("asset"), max_length=12)
    asset_contract = models.CharField(_("token contract"), max_length=42, blank=True)
    asset_decimals = models.PositiveSmallIntegerField()
    amount_units = models.DecimalField(_("amount (base units)"), max_digits=UINT256_DIGITS, decimal_places=0)
    amount_paid_units = models.DecimalField(max_digits=UINT256_DIGITS, decimal_places=0, default=0)
    # What the policy owed in the price currency, when a rule set it (cancellation), and the rate it was fixed at.
    fiat_amount = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    fiat_currency = models.CharField(max_length=3, blank=True)
    rate = models.DecimalField(max_digits=30, decimal_places=10)

    # Given by the customer (never the payer's address: exchanges pay from shared wallets). Stored lowercase.
    address = models.CharField(_("refund address"), max_length=42, blank=True)
    address_set_at = models.DateTimeField(null=True, blank=True)
    # The scan's watch of a token refund's address (payments/refund_proofs.py, `refunds_detect`): blocks read up to
    # here, from the proven block when the address was given.
    scanned_to_block = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    paid_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        verbose_name = _("refund")
        verbose_name_plural = _("refunds")
        constraints = [
            models.CheckConstraint(condition=Q(amount_units__gt=0), name="refund_amount_positive"),
            models.CheckConstraint(condition=Q(amount_paid_units__gte=0), name="refund_paid_not_negative"),
            models.CheckConstraint(
                condition=Q(status__in=["awaiting_address", "due", "partly_paid", "paid"]), name="refund_status_known"
            ),
            models.CheckConstraint(
                condition=Q(status="awaiting_address") | ~Q(address=""), name="refund_due_has_an_address"
            ),
            # One refund of an invoice per cancellation, rejection or overpayment: a reaction run twice opens one.
            models.UniqueConstraint(
                fields=["invoice", "reason"],
                condition=Q(reason__in=["cancellation", "rejection", "overpayment"]),
                name="refund_once_per_invoice_and_reason",
            ),
        ]
        indexes = [models.Index(fields=["status", "created_at"])]

    def __str__(self) -> str:
        return f"refund {self.pk} · {self.order_id} · {self.asset_symbol}"

    @property
    def amount_left_units(self) -> int:
        return max(0, int(self.amount_units) - int(self.amount_paid_units))

    @property
    def is_open(self) -> bool:
        return self.status != self.Status.PAID


class RefundAddress(models.Model):
    """Every address a refund was given, kept after a change: a transfer to any of them pays the refund (by its hash
    or the scan's watch). The customer may change the address while the operator's payout to the previous one is
    on its way; that payout still counts, so the operator never pays twice (payments/refunds.py)."""

    refund = models.ForeignKey(Refund, on_delete=models.PROTECT, related_name="addresses")
    address = models.CharField(_("refund address"), max_length=42)
    given_at = models.DateTimeField()
    # The scanner's proven block when it was given: the scan's watch counts transfers to it after this block only
    # (null: an address given before the history was kept, watched from the refund's own watch).
    watch_from_block = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["given_at", "pk"]
        verbose_name = _("refund address")
        verbose_name_plural = _("refund addresses")
        constraints = [models.UniqueConstraint(fields=["refund", "address"], name="refund_address_once")]

    def __str__(self) -> str:
        return self.address


class RefundPayment(models.Model):
    """A transaction that paid (part of) a refund, read on chain by the portal from the hash the operator entered:
    an ERC-20 Transfer log of the refund's token to its address, or the native coin of the transaction (log_index
    -1). Counted once: (chain_id, tx_hash, log_index) is unique."""

    class Status(models.TextChoices):
        SEEN = "seen", _("Seen, confirming")
        CONFIRMED = "confirmed", _("Confirmed")

    refund = models.ForeignKey(Refund, on_delete=models.PROTECT, related_name="payments")
    chain_id = models.PositiveBigIntegerField()
    tx_hash = models.CharField(max_length=66)
    log_index = models.BigIntegerField()
    block_number = models.PositiveBigIntegerField()
    block_hash = models.CharField(max_length=66)
    token_contract = models.CharField(max_length=42, blank=True)
    from_address = models.CharField(max_length=42, blank=True)
    to_address = models.CharField(max_length=42)
    amount_units = models.DecimalField(max_digits=UINT256_DIGITS, decimal_places=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.SEEN)
    entered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    first_seen_at = models.DateTimeField(default=timezone.now)
    confirmed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["block_number", "log_index"]
        verbose_name = _("refund payment")
        verbose_name_plural = _("refund payments")
        constraints = [
            models.UniqueConstraint(fields=["chain_id", "tx_hash", "log_index"], name="refund_payment_counted_once"),
            models.CheckConstraint(condition=Q(amount_units__gt=0), name="refund_payment_amount_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.tx_hash}#{self.log_index}"


# The fiscal invoices (the numbered documents a settled payment issues) live in their own module.
from payments.fiscal_models import (  # noqa: E402, F401
    FiscalDocumentFailure,
    FiscalInvoice,
    FiscalInvoiceSeries,
    InvoicingSettings,
    InvoicingSettingsChange,
)
