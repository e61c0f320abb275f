"""What is sold (environment images, prices, the booking policy) and the Order with its state machine and allocations
of the fleet's lots (inventory/).

Invariants the database guards: one price per (class, window length), positive prices and lot counts, windows
that end after they start, one credit per token hash, and (PostgreSQL, migration 0002) no two live allocations of
one lot whose periods overlap.
"""

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from booking import availability
from infrastructure.singleton import SingletonRow
from inventory.models import HardwareClass, Lot, Runtime, validate_version, version_tuple


class WindowDays(models.IntegerChoices):
    """The research windows on offer (the offer page: split validation, variants, followed campaign)."""

    THREE = 3, _("3 days")
    SEVEN = 7, _("7 days")
    THIRTY = 30, _("30 days")


class EnvironmentImage(models.Model):
    """A container image researchers start from, with the hardware classes it can run on."""

    slug = models.SlugField(_("slug"), max_length=60, unique=True)
    name = models.CharField(_("name"), max_length=100)
    image_ref = models.CharField(_("image reference"), max_length=255)
    runtime = models.CharField(_("runtime"), max_length=8, choices=Runtime.choices)
    runtime_version = models.CharField(_("CUDA or ROCm version"), max_length=20, validators=[validate_version])
    pytorch_version = models.CharField(_("PyTorch version"), max_length=20, validators=[validate_version])
    hardware_classes = models.ManyToManyField(
        HardwareClass, related_name="environments", blank=True, verbose_name=_("runs on")
    )
    is_active = models.BooleanField(_("offered"), default=True)
    position = models.PositiveSmallIntegerField(_("position"), default=0)

    class Meta:
        ordering = ["position", "name"]
        verbose_name = _("environment image")
        verbose_name_plural = _("environment images")

    def __str__(self) -> str:
        return self.name

    def incompatibility_with(self, hardware_class: HardwareClass) -> str | None:
        """Why this image cannot run on the class, or None when it can (the rule behind the M2M choices)."""
        if self.runtime != hardware_class.runtime:
            return _("%(image)s is a %(runtime)s image; %(hardware)s needs %(needed)s.") % {
                "image": self.name,
                "runtime": self.get_runtime_display(),
                "hardware": hardware_class.name,
                "needed": Runtime(hardware_class.runtime).label,
            }
        if version_tuple(self.runtime_version) < version_tuple(hardware_class.min_runtime_version):
            return _(
                "%(image)s ships %(runtime)s %(version)s, which does not target %(arch)s: "
                "%(hardware)s needs %(runtime)s %(minimum)s or newer."
            ) % {
                "image": self.name,
                "runtime": self.get_runtime_display(),
                "version": self.runtime_version,
                "arch": hardware_class.architecture,
                "hardware": hardware_class.name,
                "minimum": hardware_class.min_runtime_version,
            }
        return None


class Price(models.Model):
    """Price of one lot for one window length, in settings.PRICE_CURRENCY."""

    hardware_class = models.ForeignKey(HardwareClass, on_delete=models.CASCADE, related_name="prices")
    days = models.PositiveSmallIntegerField(_("window"), choices=WindowDays.choices)
    amount_per_lot = models.DecimalField(
        _("price per lot"), max_digits=12, decimal_places=2, validators=[MinValueValidator(Decimal("0.01"))]
    )

    class Meta:
        ordering = ["hardware_class", "days"]
        verbose_name = _("price")
        verbose_name_plural = _("prices")
        constraints = [
            models.UniqueConstraint(fields=["hardware_class", "days"], name="one_price_per_class_and_window"),
            models.CheckConstraint(condition=Q(amount_per_lot__gt=0), name="price_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.hardware_class} · {self.days} d · {self.amount_per_lot}"


class BookingPolicy(SingletonRow, models.Model):
    """Operator-set rules of the booking desk. One row (pk=1), edited in the admin."""

    turnaround_hours = models.PositiveSmallIntegerField(
        _("turnaround (hours)"),
        default=6,
        help_text=_("Reserved before each window (provisioning, pre-flight) and after it (teardown)."),
    )
    hold_minutes = models.PositiveSmallIntegerField(
        _("hold (minutes)"),
        default=60,
        validators=[MinValueValidator(5)],
        help_text=_("How long unpaid lots stay held; the payment quote lives as long."),
    )
    min_notice_hours = models.PositiveSmallIntegerField(
        _("minimum notice (hours)"),
        default=4,
        help_text=_("A window may start no sooner than this after the booking (windows start at 00:00 UTC)."),
    )
    offer_start_when_ready = models.BooleanField(
        _("offer windows that start as soon as ready"),
        default=True,
        help_text=_(
            "A researcher may book a window that starts today, at the first full hour its hosts can make (each "
            "host's “ready within”): its days count from the hand-over. The minimum notice applies to dated "
            "windows only."
        ),
    )
    start_when_ready_allowance_hours = models.PositiveSmallIntegerField(
        _("allowance of a window that starts when ready (hours)"),
        default=4,
        validators=[MinValueValidator(1), MaxValueValidator(48)],
        help_text=_(
            "Its lots are held this much longer than its planned end, so that a hand-over this late (payment, "
            "approval, preparation) still gives the full window. A later hand-over gives a window ending there."
        ),
    )
    horizon_days = models.PositiveSmallIntegerField(
        _("booking horizon (days)"), default=180, validators=[MinValueValidator(7)]
    )
    max_lots_per_order = models.PositiveSmallIntegerField(
        _("most lots in one order"), default=8, validators=[MinValueValidator(1)]
    )
    max_unpaid_lots_per_client = models.PositiveSmallIntegerField(
        _("most unpaid lots per client"),
        default=8,
        validators=[MinValueValidator(1)],
        help_text=_(
            "How many lots one e-mail address, or one client address, may hold unpaid at a time (holding lots "
            "costs nothing until paid)."
        ),
    )
    unconfirmed_share_percent = models.PositiveSmallIntegerField(
        _("share of a class held unpaid by contacts who never paid (%)"),
        default=50,
        validators=[MaxValueValidator(100)],
        help_text=_(
            "Of each hardware class's lots, how many (in %, rounded down) bookings of contacts who never paid an "
            "order may hold unpaid over the same dates, however many addresses and client addresses they use: the "
            "rest stays on sale for researchers who paid before and confirmed their address (an e-mailed link "
            "opened in their browser). 100: no share."
        ),
    )

    class Meta:
        verbose_name = _("booking policy")
        verbose_name_plural = _("booking policy")
        constraints = [
            models.CheckConstraint(condition=Q(pk=1), name="booking_policy_single_row"),
            models.CheckConstraint(
                condition=Q(unconfirmed_share_percent__lte=100), name="booking_policy_unconfirmed_share_percent"
            ),
        ]

    def __str__(self) -> str:
        return str(_("Booking policy"))

    @property
    def turnaround(self) -> timedelta:
        return timedelta(hours=self.turnaround_hours)

    @property
    def start_when_ready_allowance(self) -> timedelta:
        return timedelta(hours=self.start_when_ready_allowance_hours)


class TermsDocument(models.TextChoices):
    """The documents of a terms version, each written in every language of the site."""

    TERMS = "terms", _("Terms of sale")
    CANCELLATION = "cancellation", _("Cancellation and refund policy")
    LEGAL = "legal", _("Legal notice")
    PRIVACY = "privacy", _("Privacy notice")


class TermsPublished(Exception):
    """A published terms version was about to change: what an order accepted must stay as it was."""


class TermsVersion(models.Model):
    """The terms of sale, the cancellation and refund policy, the legal notice and the privacy notice, in French and
    English, as one version. A draft is edited freely; publishing gives it the next number and freezes it (a change
    is a new version): an order keeps the version it accepted (`Order.terms_version`)."""

    number = models.PositiveIntegerField(_("version"), unique=True, null=True, blank=True, editable=False)
    published_at = models.DateTimeField(_("published"), null=True, blank=True, editable=False)
    terms_en = models.TextField(_("terms of sale (English)"))
    terms_fr = models.TextField(_("terms of sale (French)"))
    cancellation_en = models.TextField(_("cancellation and refund policy (English)"))
    cancellation_fr = models.TextField(_("cancellation and refund policy (French)"))
    legal_en = models.TextField(
        _("legal notice (English)"),
        help_text=_("Seller identity, registration and VAT numbers, contact address, host of the site."),
    )
    legal_fr = models.TextField(_("legal notice (French)"))
    privacy_en = models.TextField(_("privacy notice (English)"))
    privacy_fr = models.TextField(_("privacy notice (French)"))
    # The cancellation rules of a paid order, part of the version: an order is refunded by the rules it accepted.
    full_refund_days_before = models.PositiveSmallIntegerField(
        _("full refund until (days before the start)"),
        default=7,
        help_text=_(
            "Until this many days before the window starts, a cancelled paid order is refunded in full, "
            "less the cancellation fee."
        ),
    )
    cancellation_fee = models.DecimalField(
        _("cancellation fee"),
        max_digits=10,
        decimal_places=2,
        default=Decimal("0.00"),
        validators=[MinValueValidator(Decimal("0"))],
        help_text=_("In the price currency, kept on a full refund."),
    )
    partial_refund_percent = models.PositiveSmallIntegerField(
        _("refund after that, until the start (%)"),
        default=50,
        help_text=_(
            "Share of the price refunded when a paid order is cancelled later, until its window starts. "
            "Nothing is refunded once the window has started."
        ),
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        ordering = [models.F("number").desc(nulls_first=True), "-created_at"]
        verbose_name = _("terms version")
        verbose_name_plural = _("terms versions")
        constraints = [
            models.CheckConstraint(
                condition=Q(number__isnull=True, published_at__isnull=True)
                | Q(number__isnull=False, published_at__isnull=False),
                name="terms_published_with_number",
            ),
            models.CheckConstraint(condition=Q(partial_refund_percent__lte=100), name="terms_refund_percent_max"),
            models.CheckConstraint(condition=Q(cancellation_fee__gte=0), name="terms_fee_not_negative"),
        ]

    def __str__(self) -> str:
        if self.number is None:
            return str(_("Draft of %(created)s") % {"created": self.created_at.strftime("%Y-%m-%d %H:%M")})
        return str(_("Version %(number)s") % {"number": self.number})

    def save(self, *args, **kwargs) -> None:
        # The guard behind the admin's read-only form: a published row is never written again (publishing itself
        # is one UPDATE in booking/terms.py, from a draft, under the row's lock).
        if self.pk is None or kwargs.get("force_insert"):
            super().save(*args, **kwargs)
            return
        with transaction.atomic():
            if self._published_under_lock():
                raise TermsPublished(f"terms version {self.pk} is published and cannot change")
            super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        with transaction.atomic():
            if self._published_under_lock():
                raise TermsPublished(f"terms version {self.pk} is published and cannot be deleted")
            return super().delete(*args, **kwargs)

    def _published_under_lock(self) -> bool:
        """Whether the stored row is published, read under its lock: a publication not yet committed is waited for
        and then seen (an unlocked read would see the draft, and the write that follows would turn the published
        version back into one). The lock is on the row by key: a filter on `published_at` would skip the row."""
        stored = TermsVersion.objects.select_for_update().filter(pk=self.pk).values_list("published_at", flat=True)
        return any(published_at is not None for published_at in stored)

    @property
    def is_published(self) -> bool:
        return self.published_at is not None

    def text(self, document: str, language: str) -> str:
        """One document in one language (English when the language is not one the version is written in)."""
        language = language if language in ("en", "fr") else "en"
        return getattr(self, f"{TermsDocument(document).value}_{language}")


class OrderStatus(models.TextChoices):
    AWAITING_PAYMENT = "awaiting_payment", _("Awaiting payment")
    PAYMENT_PROCESSING = "payment_processing", _("Payment being confirmed")
    PAID = "paid", _("Paid, awaiting approval")
    APPROVED = "approved", _("Approved")
    REJECTED = "rejected", _("Rejected")
    PROVISIONING = "provisioning", _("Preparing access")
    PROVISIONING_FAILED = "provisioning_failed", _("Access preparation delayed")
    READY = "ready", _("Ready")
    ACTIVE = "active", _("Active")
    ENDED = "ended", _("Ended")
    EXPIRED = "expired", _("Expired")
    CANCELLED = "cancelled", _("Cancelled")


# An order in one of these was paid (its contact's mailbox has paid an order: booking/placing.py's share of unpaid
# holds does not bind it once confirmed).
PAID_ONCE_STATUSES = frozenset(
    {
        OrderStatus.PAID,
        OrderStatus.APPROVED,
        OrderStatus.PROVISIONING,
        OrderStatus.PROVISIONING_FAILED,
        OrderStatus.READY,
        OrderStatus.ACTIVE,
        OrderStatus.ENDED,
    }
)


def mailbox_of(email: str) -> str:
    """The mailbox an address delivers to, as the limits on unpaid holds compare addresses: case-folded, its
    "+tag" dropped (s+1@ and s+2@ are one mailbox at every provider that delivers plus-addresses). Dots are kept:
    only some providers ignore them."""
    local, at, domain = email.strip().casefold().rpartition("@")
    if not at:
        return domain
    untagged = local.split("+", 1)[0]
    return f"{untagged or local}@{domain}"


# The order's state machine, in one table (docs/architecture.md, "One order's life"). A late payment may revive an
# expired order (payments re-allocates).
ORDER_TRANSITIONS: dict[str, frozenset[str]] = {
    OrderStatus.AWAITING_PAYMENT: frozenset(
        {OrderStatus.PAYMENT_PROCESSING, OrderStatus.PAID, OrderStatus.EXPIRED, OrderStatus.CANCELLED}
    ),
    OrderStatus.PAYMENT_PROCESSING: frozenset({OrderStatus.AWAITING_PAYMENT, OrderStatus.PAID, OrderStatus.CANCELLED}),
    OrderStatus.PAID: frozenset({OrderStatus.APPROVED, OrderStatus.REJECTED, OrderStatus.CANCELLED}),
    OrderStatus.APPROVED: frozenset({OrderStatus.PROVISIONING, OrderStatus.CANCELLED}),
    OrderStatus.PROVISIONING: frozenset({OrderStatus.READY, OrderStatus.PROVISIONING_FAILED, OrderStatus.CANCELLED}),
    # READY: the pre-flight check failed and an operator hands the machines over anyway (or it passes on a re-run).
    OrderStatus.PROVISIONING_FAILED: frozenset({OrderStatus.PROVISIONING, OrderStatus.READY, OrderStatus.CANCELLED}),
    OrderStatus.READY: frozenset(
        {OrderStatus.ACTIVE, OrderStatus.PROVISIONING, OrderStatus.ENDED, OrderStatus.CANCELLED}
    ),
    OrderStatus.ACTIVE: frozenset({OrderStatus.ENDED}),
    OrderStatus.EXPIRED: frozenset({OrderStatus.PAID}),
    OrderStatus.REJECTED: frozenset(),
    OrderStatus.ENDED: frozenset(),
    OrderStatus.CANCELLED: frozenset(),
}
KEYS_CHANGEABLE_STATUSES = frozenset(
    {
        OrderStatus.PAID,
        OrderStatus.APPROVED,
        OrderStatus.PROVISIONING,
        OrderStatus.PROVISIONING_FAILED,
        OrderStatus.READY,
        OrderStatus.ACTIVE,
        # the files are kept until the wipe, read-only by SFTP with the order's keys: a lost key is removed then too
        OrderStatus.ENDED,
    }
)
# Entering one of these releases the order's lots.
RELEASING_STATUSES = frozenset({OrderStatus.EXPIRED, OrderStatus.CANCELLED, OrderStatus.ENDED, OrderStatus.REJECTED})
# A paid order the customer can still cancel (for the refund its terms give): every state before the window runs.
PAID_CANCELLABLE_STATUSES = frozenset(
    {
        OrderStatus.PAID,
        OrderStatus.APPROVED,
        OrderStatus.PROVISIONING,
        OrderStatus.PROVISIONING_FAILED,
        OrderStatus.READY,
    }
)
# Nothing more will happen by itself: the order page stops polling.
SETTLED_STATUSES = frozenset({OrderStatus.EXPIRED, OrderStatus.CANCELLED, OrderStatus.ENDED, OrderStatus.REJECTED})


class Hypothesis(models.TextChoices):
    """What the researcher expects two cards to bring (the offer page: write it down before renting)."""

    BIGGER_BATCH = "bigger_batch", _("A bigger global batch")
    SHORTER_STEP = "shorter_step", _("A shorter step")
    MAKE_POSSIBLE = "make_possible", _("Make the run possible at all (the model does not fit one card)")
    COMPARE_HYPERPARAMETERS = "compare_hyperparameters", _("Compare hyperparameters")
    OTHER = "other", _("Something else")


class Sharing(models.TextChoices):
    """What the two cards share (the offer page: decide it first; 360 GB added up is not one allocation)."""

    FULL_COPY = "full_copy", _("A full copy of the model on each card (data parallel)")
    PARAMETERS_SHARDED = "parameters_sharded", _("Parameters, gradients and optimizer states sharded (FSDP, ZeRO-3)")
    LAYERS_SPLIT = "layers_split", _("Layers split across the two cards (pipeline)")
    INDEPENDENT_RUNS = "independent_runs", _("Nothing: two independent runs, one per card")
    NOT_SURE = "not_sure", _("Not sure yet (the fit advisor below helps)")


# A followed campaign checkpoints at least once a day and at most every hour (the offer: 30 days with checkpoints).
CHECKPOINT_INTERVAL_HOURS = (1, 24)


class AlertMails(models.TextChoices):
    """How often the readings' watch may e-mail a researcher about a kind of alert."""

    DAILY = "daily", _("at most once a day")
    ONCE = "once", _("once per window")
    OFF = "off", _("never")


class Order(models.Model):
    public_id = models.CharField(_("order number"), max_length=16, unique=True, editable=False)
    status = models.CharField(
        _("status"), max_length=24, choices=OrderStatus.choices, default=OrderStatus.AWAITING_PAYMENT
    )
    hardware_class = models.ForeignKey(
        HardwareClass, on_delete=models.PROTECT, related_name="orders", verbose_name=_("hardware class")
    )
    environment = models.ForeignKey(
        EnvironmentImage, on_delete=models.PROTECT, related_name="orders", verbose_name=_("environment")
    )
    lot_count = models.PositiveSmallIntegerField(_("lots"))
    days = models.PositiveSmallIntegerField(_("window"), choices=WindowDays.choices)
    starts_at = models.DateTimeField(_("window starts"))
    ends_at = models.DateTimeField(_("window ends"))
    # Booked to start as soon as ready: `starts_at` is the planned start (a full hour) until the hand-over, when
    # the window's days start counting (`clock_started_at`, booking.services.order_start_clock).
    start_when_ready = models.BooleanField(_("starts as soon as ready"), default=False)
    clock_started_at = models.DateTimeField(_("clock started at hand-over"), null=True, blank=True, editable=False)

    contact_name = models.CharField(_("name"), max_length=120)
    contact_email = models.EmailField(_("e-mail"), max_length=254)
    # The address's mailbox (mailbox_of), kept with it by save(): the limits on unpaid holds compare mailboxes.
    contact_mailbox = models.CharField(_("mailbox"), max_length=254, blank=True, editable=False)
    organisation = models.CharField(_("organisation"), max_length=200)
    messenger = models.CharField(_("messenger handle"), max_length=100, blank=True)
    # Who the fiscal invoice is made out to (booking/billing.py checks them; editable until it is issued). Blank only
    # for orders placed before billing details were asked.
    billing_address = models.TextField(_("billing address"), max_length=500, blank=True)
    billing_country = models.CharField(_("billing country"), max_length=2, blank=True)
    vat_number = models.CharField(_("VAT number"), max_length=20, blank=True)
    purchase_order = models.CharField(_("purchase order reference"), max_length=64, blank=True)

    sharing = models.CharField(
        _("what the two cards share"), max_length=24, choices=Sharing.choices, default=Sharing.NOT_SURE
    )
    hypothesis = models.CharField(_("hypothesis"), max_length=32, choices=Hypothesis.choices)
    hypothesis_detail = models.TextField(_("hypothesis, in your words"), blank=True)
    hypothesis_measure = models.TextField(_("the measure that would confirm it"), blank=True)
    # A 30-day campaign's plan (required for 30 days by the booking rules; blank for shorter windows).
    checkpoint_interval_hours = models.PositiveSmallIntegerField(_("checkpoint every (hours)"), null=True, blank=True)
    stop_criteria = models.TextField(_("stop criteria"), blank=True)
    # Where the researcher's job writes its checkpoints, relative to their home (booking.rules.clean_checkpoint_dir):
    # the readings' watch reads only the newest file's time there, from inside the container (provisioning/watch.py).
    checkpoint_dir = models.CharField(_("checkpoint directory"), max_length=200, blank=True)
    # How often the watch reads it, when the researcher set it on the order page (None: the interval declared at
    # booking, which stays as written there).
    checkpoint_watch_hours = models.PositiveSmallIntegerField(
        _("checkpoints watched every (hours)"), null=True, blank=True
    )
    notes = models.TextField(_("notes"), blank=True)

    currency = models.CharField(_("currency"), max_length=3)
    price_per_lot = models.DecimalField(_("price per lot"), max_digits=12, decimal_places=2)
    total_price = models.DecimalField(_("total"), max_digits=14, decimal_places=2)
    # What the paid extensions of the window cost (booking.services.order_extend), and what was refunded already
    # for time lost to provider faults: the cancellation rules apply to everything paid, and never give back more
    # than is left of it (booking/cancellation.py).
    extensions_price = models.DecimalField(_("extensions paid"), max_digits=14, decimal_places=2, default=0)
    fault_refunds = models.DecimalField(_("refunded for provider faults"), max_digits=14, decimal_places=2, default=0)
    hold_expires_at = models.DateTimeField(_("lots held until"), null=True, blank=True)
    # While an extension's invoice is open, the lots stay held past the window for it until then (booking.services
    # extension_hold); the sweep gives the extra days back when it passes unpaid.
    extension_held_until = models.DateTimeField(_("extension held until"), null=True, blank=True)
    # The memory-fit advisor's inputs and verdict when the researcher used it while booking (booking/fit.py).
    fit_inputs = models.JSONField(_("fit advisor inputs"), null=True, blank=True)
    fit_advice = models.JSONField(_("fit advisor verdict"), null=True, blank=True)
    # The researcher's archcheck report (nodekit/archcheck.py), given at booking and validated
    # (booking/archcheck_report.py): which of their compiled extensions carry code for the order's cards.
    archcheck_report = models.JSONField(_("archcheck report"), null=True, blank=True)
    # How often the readings' watch may e-mail the researcher about an unbalanced split or idle cards
    # (provisioning/watch.py); the order page always shows it. Set on the order page, off in one click.
    alert_mails = models.CharField(
        _("e-mails about unbalanced or idle cards"), max_length=8, choices=AlertMails.choices, default=AlertMails.DAILY
    )
    language = models.CharField(_("language"), max_length=8, default="en")
    # A keyed digest of the client address the order was placed from (infrastructure.client.client_key), for the limit
    # on unpaid lots; the address itself is not kept.
    client_key = models.CharField(_("client key"), max_length=64, blank=True, editable=False)
    # When a link sent to the contact's address was first opened: from then on the order counts toward that
    # address's limit of unpaid lots (a stranger cannot spend a researcher's limit by typing their address).
    email_verified_at = models.DateTimeField(_("e-mail address confirmed"), null=True, blank=True, editable=False)
    # The terms the customer accepted when booking; null only for orders placed before terms were versioned.
    terms_version = models.ForeignKey(
        TermsVersion,
        on_delete=models.PROTECT,
        related_name="orders",
        null=True,
        blank=True,
        editable=False,
        verbose_name=_("terms accepted"),
    )
    # What the customer is owed back after cancelling a paid order, by the rules of `terms_version`.
    refund_due = models.DecimalField(_("refund due"), max_digits=14, decimal_places=2, null=True, blank=True)
    # The earlier order of the same customer whose data volume this order takes over on the same host (opted in at
    # booking from that order's link): provisioning moves the volume instead of making an empty one. One live order
    # at most carries a given order's data (constraint below); an order that expires or is cancelled frees it.
    carry_data_from = models.ForeignKey(
        "self",
        on_delete=models.PROTECT,
        related_name="data_carried_to",
        null=True,
        blank=True,
        editable=False,
        verbose_name=_("data carried from"),
    )

    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("order")
        verbose_name_plural = _("orders")
        permissions = [("operate_orders", "Can operate orders in the operator console")]
        constraints = [
            models.CheckConstraint(condition=Q(starts_at__lt=models.F("ends_at")), name="order_window_positive"),
            models.CheckConstraint(condition=Q(lot_count__gte=1), name="order_has_lots"),
            models.CheckConstraint(condition=Q(total_price__gt=0), name="order_total_positive"),
            models.CheckConstraint(condition=Q(status__in=OrderStatus.values), name="order_status_known"),
            models.UniqueConstraint(
                fields=["carry_data_from"],
                condition=Q(carry_data_from__isnull=False) & ~Q(status__in=["expired", "cancelled", "rejected"]),
                name="one_live_order_carries_a_volume",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "hold_expires_at"]),
            models.Index(fields=["contact_email"]),
            models.Index(fields=["contact_mailbox"]),
        ]

    def __str__(self) -> str:
        return self.public_id

    def save(self, *args, **kwargs) -> None:
        self.contact_mailbox = mailbox_of(self.contact_email)
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and "contact_email" in update_fields:
            kwargs["update_fields"] = {*update_fields, "contact_mailbox"}
        super().save(*args, **kwargs)

    @property
    def checkpoint_watch_interval_hours(self) -> int | None:
        """How often the checkpoint directory is read: the order page's choice, else the interval declared at
        booking."""
        return self.checkpoint_watch_hours or self.checkpoint_interval_hours

    @property
    def is_settled(self) -> bool:
        return self.status in SETTLED_STATUSES

    @property
    def can_be_cancelled_by_customer(self) -> bool:
        return self.status == OrderStatus.AWAITING_PAYMENT

    @property
    def keys_can_change(self) -> bool:
        """From payment to the end of the window and after it: the hand-over writes the keys as they are then, a
        window that runs has them rewritten at once, and so does the download window after the end."""
        return self.status in KEYS_CHANGEABLE_STATUSES

    @property
    def can_be_cancelled_with_refund(self) -> bool:
        """Paid and not started: the customer cancels by the rules of the terms they accepted."""
        return self.status in PAID_CANCELLABLE_STATUSES and self.terms_version_id is not None

    @property
    def can_be_ended_early(self) -> bool:
        return self.status in (OrderStatus.READY, OrderStatus.ACTIVE)

    @property
    def greeting_name(self) -> str:
        """The contact's name for an e-mail greeting, or "" for a plain "Hello,": see `plain_name`."""
        return plain_name(self.contact_name)


_NAME_PUNCTUATION = frozenset(" '’-.")


def plain_name(name: str) -> str:
    """The name if it reads as a person's name and nothing else, else "".

    The contact's address is not verified: anyone can book with a stranger's e-mail address, and what they typed
    would reach that stranger from our domain. So e-mails carry nothing typed but a greeting, and the name only when
    it is at most five words of letters, apostrophes, hyphens and initials (no digit, no "/", ":" or "@", no dot
    inside a word: nothing that could be a link or a domain)."""
    words = name.split()
    if not words or len(words) > 5 or len(" ".join(words)) > 60:
        return ""
    if any(not (char.isalpha() or char in _NAME_PUNCTUATION) for word in words for char in word):
        return ""
    if any("." in word[:-1] or not word[0].isalpha() for word in words):
        return ""
    return " ".join(words)


class OrderAccessToken(models.Model):
    """A secret link to an order. Only the SHA-256 of the token is stored; a resend mints a new one."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="access_tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Sent by e-mail (not the one shown in the browser at booking): opening it proves the order's contact reads
    # that mailbox (Order.email_verified_at).
    mailed = models.BooleanField(default=False)

    class Meta:
        verbose_name = _("access token")
        verbose_name_plural = _("access tokens")

    def __str__(self) -> str:
        return f"{self.order} · {self.token_hash[:8]}…"


class OrderSshKey(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="ssh_keys")
    key_type = models.CharField(_("type"), max_length=64)
    bits = models.PositiveIntegerField(_("bits"))
    fingerprint = models.CharField(_("fingerprint"), max_length=80)
    public_key = models.TextField(_("public key"))

    class Meta:
        ordering = ["pk"]
        verbose_name = _("SSH key")
        verbose_name_plural = _("SSH keys")
        constraints = [models.UniqueConstraint(fields=["order", "fingerprint"], name="one_key_per_fingerprint")]

    def __str__(self) -> str:
        return f"{self.key_type} {self.fingerprint}"


class OrderEvent(models.Model):
    """One row per transition (and per notable action): the order's audit trail. Never edited."""

    class Actor(models.TextChoices):
        CUSTOMER = "customer", _("Customer")
        SYSTEM = "system", _("System")
        OPERATOR = "operator", _("Operator")
        ADMIN = "admin", _("Admin")

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(auto_now_add=True)
    from_status = models.CharField(max_length=24, choices=OrderStatus.choices, blank=True)
    to_status = models.CharField(max_length=24, choices=OrderStatus.choices)
    actor_kind = models.CharField(max_length=16, choices=Actor.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    reason = models.TextField(blank=True)
    evidence = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["created_at", "pk"]
        verbose_name = _("order event")
        verbose_name_plural = _("order events")

    def __str__(self) -> str:
        return f"{self.order_id}: {self.from_status or '∅'} → {self.to_status}"


class AllocationQuerySet(models.QuerySet):
    """Every write to allocations changes what can be booked. Single saves and deletes say so through the receivers
    booking/apps.py connects; the bulk writes, which send no signal, say so here, so no caller bumps by hand."""

    def update(self, **values) -> int:
        count = super().update(**values)
        availability.bump_generation()
        return count

    def bulk_create(self, objs, *args, **kwargs) -> list:
        created = super().bulk_create(objs, *args, **kwargs)
        availability.bump_generation()
        return created

    def in_use(self) -> "AllocationQuerySet":
        """The lots the order uses: live and not vacated (a lot a move took the order off stays live, held for no
        one, until the container that held its cards is gone)."""
        return self.filter(released_at__isnull=True, vacated_at__isnull=True)


class Allocation(models.Model):
    """A lot held for an order over [window start − turnaround, window end + turnaround).

    Live while `released_at` is null. PostgreSQL forbids two live allocations of one lot whose periods overlap
    (exclusion constraint `allocation_no_overlap`, migration 0002).

    `vacated_at`: a provider-fault move took the order off the lot (services.order_move_lot). The order no longer
    uses it, but it stays live, so nobody books it, until provisioning has seen the container that held its cards
    go (services.allocations_release_vacated); the release then sets `released_at`.
    """

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="allocations")
    lot = models.ForeignKey(Lot, on_delete=models.PROTECT, related_name="allocations")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    vacated_at = models.DateTimeField(null=True, blank=True)

    objects = AllocationQuerySet.as_manager()

    class Meta:
        ordering = ["lot__name"]
        verbose_name = _("allocation")
        verbose_name_plural = _("allocations")
        constraints = [
            models.CheckConstraint(condition=Q(starts_at__lt=models.F("ends_at")), name="allocation_period_positive"),
        ]
        indexes = [
            models.Index(
                fields=["lot", "starts_at", "ends_at"],
                condition=Q(released_at__isnull=True),
                name="live_allocation_period",
            )
        ]

    def __str__(self) -> str:
        return f"{self.lot} for {self.order}"


class SplitTrialReport(models.Model):
    """A split-trial kit report uploaded by the researcher, validated (booking/split_trial_report.py) and kept
    with the order."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="split_trials")
    uploaded_at = models.DateTimeField(auto_now_add=True)
    report = models.JSONField()

    class Meta:
        ordering = ["-uploaded_at"]
        verbose_name = _("split-trial report")
        verbose_name_plural = _("split-trial reports")

    def __str__(self) -> str:
        return f"{self.order_id} · {self.uploaded_at:%Y-%m-%d %H:%M}"
