"""Admin review of payments: invoices by status and exception, the transfers seen (with explorer links),
"re-check on chain now", "mark paid" with a required reason (audited in the order's events and the admin log),
and the queue of transfers that matched no invoice or the wrong asset."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import Q
from django.shortcuts import render
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from infrastructure.admin import ReadOnlyAdmin
from infrastructure.singleton import SingletonAdmin
from payments import config, invoices, settlement
from payments.errors import PaymentError
from payments.models import (
    ChainCursor,
    Invoice,
    OperatorRate,
    PaymentSettings,
    Refund,
    RefundAddress,
    RefundPayment,
    Transfer,
)
from payments.selectors import format_units


def _explorer_link(transfer: Transfer) -> str:
    chain = config.chain(transfer.chain_id)
    url = chain.tx_url(transfer.tx_hash) if chain else ""
    return (
        format_html('<a href="{}" rel="noopener noreferrer">{}</a>', url, transfer.tx_hash) if url else transfer.tx_hash
    )


class TransferInline(admin.TabularInline):
    model = Transfer
    extra = 0
    can_delete = False
    fields = [
        "tx",
        "log_index",
        "block_number",
        "token_contract",
        "from_address",
        "amount_units",
        "status",
        "wrong_asset",
        "first_seen_at",
        "confirmed_at",
    ]
    readonly_fields = fields

    @admin.display(description=_("transaction"))
    def tx(self, transfer: Transfer) -> str:
        return _explorer_link(transfer)

    def has_add_permission(self, request, obj=None):
        return False


class ExceptionFilter(admin.SimpleListFilter):
    title = _("exception")
    parameter_name = "exception"

    def lookups(self, request, model_admin):
        return [
            ("partial", _("Partially paid")),
            ("over", _("Overpaid (refund)")),
            ("late", _("Paid late")),
            ("operator", _("Needs an operator")),
            ("marked", _("Marked paid")),
            ("wrong", _("Wrong asset received")),
            ("clicked", _("Customer says paid, not settled")),
        ]

    def queryset(self, request, queryset):
        match self.value():
            case "partial":
                return queryset.filter(paid_partial=True)
            case "over":
                return queryset.filter(paid_over=True)
            case "late":
                return queryset.filter(paid_late=True)
            case "operator":
                return queryset.filter(needs_operator=True)
            case "marked":
                return queryset.filter(marked=True)
            case "wrong":
                return queryset.filter(transfers__wrong_asset=True).distinct()
            case "clicked":
                return queryset.filter(customer_paid_at__isnull=False).exclude(status=Invoice.Status.SETTLED)
        return queryset


class MarkPaidForm(forms.Form):
    reason = forms.CharField(label=_("Reason (kept in the order's history)"), widget=forms.Textarea, max_length=2000)


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = [
        "order",
        "status",
        "asset_symbol",
        "chain_id",
        "due",
        "received",
        "expires_at",
        "flags",
        "customer_paid_at",
    ]
    list_filter = ["status", ExceptionFilter, "chain_id", "asset_symbol", "purpose"]
    list_select_related = ["order"]
    search_fields = ["order__public_id", "deposit_address", "transfers__tx_hash", "order__contact_email"]
    date_hierarchy = "created_at"
    inlines = [TransferInline]
    actions = ["recheck_on_chain", "mark_paid"]
    readonly_fields = [field.name for field in Invoice._meta.fields]

    @admin.display(description=_("due"))
    def due(self, invoice: Invoice) -> str:
        return format_units(invoice.amount_due_units, invoice.asset_decimals)

    @admin.display(description=_("received"))
    def received(self, invoice: Invoice) -> str:
        return format_units(invoice.amount_confirmed_units, invoice.asset_decimals)

    @admin.display(description=_("flags"))
    def flags(self, invoice: Invoice) -> str:
        names = [
            ("paid_partial", "partial"),
            ("paid_over", "over"),
            ("paid_late", "late"),
            ("needs_operator", "operator"),
            ("marked", "marked"),
        ]
        return " ".join(label for field, label in names if getattr(invoice, field))

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description=_("Re-check on chain now"), permissions=["review"])
    def recheck_on_chain(self, request, queryset):
        queued = sum(invoices.invoice_request_check(invoice_id=invoice.pk) for invoice in queryset)
        self.message_user(request, _("%(count)d check(s) queued.") % {"count": queued}, messages.SUCCESS)

    @admin.action(description=_("Mark paid (reason required)"), permissions=["review"])
    def mark_paid(self, request, queryset):
        form = MarkPaidForm(request.POST if "reason" in request.POST else None)
        if form.is_valid():
            done = 0
            for invoice in queryset:
                try:
                    settlement.invoice_mark_paid(invoice=invoice, user=request.user, reason=form.cleaned_data["reason"])
                except PaymentError as exc:
                    self.message_user(request, f"{invoice.order}: {exc.message}", messages.ERROR)
                else:
                    self.log_change(request, invoice, f"Marked paid: {form.cleaned_data['reason']}")
                    done += 1
            self.message_user(request, _("%(count)d invoice(s) marked paid.") % {"count": done}, messages.SUCCESS)
            return None
        return render(
            request,
            "admin/payments/mark_paid.html",
            {
                **self.admin_site.each_context(request),
                "form": form,
                "invoices": queryset,
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
                "opts": self.model._meta,
                "title": _("Mark paid"),
            },
        )

    def has_review_permission(self, request):
        return request.user.has_perm("payments.review_payments")


class UnmatchedFilter(admin.SimpleListFilter):
    title = _("matching")
    parameter_name = "matching"

    def lookups(self, request, model_admin):
        return [("unmatched", _("No invoice or wrong asset"))]

    def queryset(self, request, queryset):
        if self.value() == "unmatched":
            return queryset.filter(Q(invoice__isnull=True) | Q(wrong_asset=True))
        return queryset


@admin.register(Transfer)
class TransferAdmin(admin.ModelAdmin):
    list_display = [
        "tx",
        "chain_id",
        "block_number",
        "token_contract",
        "to_address",
        "amount_units",
        "status",
        "wrong_asset",
        "invoice",
    ]
    list_filter = [UnmatchedFilter, "status", "wrong_asset", "chain_id"]
    search_fields = ["tx_hash", "to_address", "from_address"]
    readonly_fields = [field.name for field in Transfer._meta.fields]

    @admin.display(description=_("transaction"))
    def tx(self, transfer: Transfer) -> str:
        return _explorer_link(transfer)

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(OperatorRate)
class OperatorRateAdmin(admin.ModelAdmin):
    list_display = ["asset_symbol", "chain_id", "fiat_currency", "rate", "updated_at", "updated_by"]

    def save_model(self, request, obj, form, change):
        obj.updated_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(ChainCursor)
class ChainCursorAdmin(admin.ModelAdmin):
    list_display = ["chain_id", "confirmed_block", "head_block", "last_scan_at", "unavailable_since", "last_error"]
    readonly_fields = [field.name for field in ChainCursor._meta.fields]

    def has_add_permission(self, request):
        return False


@admin.register(PaymentSettings)
class PaymentSettingsAdmin(SingletonAdmin):
    pass


class RefundPaymentInline(admin.TabularInline):
    model = RefundPayment
    extra = 0
    can_delete = False
    readonly_fields = [field.name for field in RefundPayment._meta.fields]

    def has_add_permission(self, request, obj=None):
        return False


class RefundAddressInline(admin.TabularInline):
    """Every address the refund was given: a transfer to any of them pays it."""

    model = RefundAddress
    extra = 0
    can_delete = False
    readonly_fields = [field.name for field in RefundAddress._meta.fields]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Refund)
class RefundAdmin(ReadOnlyAdmin):
    """Read only: a refund moves only through the customer's address form and a transaction read on chain (the
    console's refunds queue)."""

    list_display = ["pk", "order", "reason", "status", "asset_symbol", "chain_id", "amount", "address", "created_at"]
    list_filter = ["status", "reason", "chain_id", "asset_symbol"]
    search_fields = ["order__public_id", "address", "addresses__address", "payments__tx_hash"]
    readonly_fields = [field.name for field in Refund._meta.fields]
    inlines = [RefundAddressInline, RefundPaymentInline]

    @admin.display(description=_("amount"))
    def amount(self, refund: Refund) -> str:
        return f"{format_units(refund.amount_units, refund.asset_decimals)} {refund.asset_symbol}"


from payments import fiscal_admin  # noqa: E402, F401  (the fiscal invoices' admin registers itself)
