"""The admin of the fiscal invoices (imported by payments/admin.py): the seller's details and VAT rate the operator
sets, and the issued invoices, read-only (an issued invoice never changes; it is corrected by a credit note)."""

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from booking.billing import NOT_PRINTABLE_MESSAGE, printable
from infrastructure.admin import ReadOnlyAdmin
from infrastructure.singleton import SingletonAdmin
from payments import fiscal_documents
from payments.models import (
    FiscalDocumentFailure,
    FiscalInvoice,
    FiscalInvoiceSeries,
    InvoicingSettings,
    InvoicingSettingsChange,
)

SETTINGS_FIELDS = [
    "seller_name",
    "seller_address",
    "seller_country",
    "seller_vat_number",
    "seller_registration",
    "legal_mentions",
    "vat_rate_percent",
    "number_prefix",
]


class InvoicingSettingsForm(forms.ModelForm):
    """The seller's details are printed on every invoice, in its XML too: what XML cannot hold is refused here, or
    every invoice issued after the change would be unprintable."""

    class Meta:
        model = InvoicingSettings
        fields = SETTINGS_FIELDS

    def clean_vat_rate_percent(self):
        # The rate is the standard rate (EN 16931 category S) of the buyers who pay VAT: S at 0 % breaks BR-S-05, and
        # every invoice issued after the change would carry it.
        rate = self.cleaned_data["vat_rate_percent"]
        if rate is not None and rate <= 0:
            raise forms.ValidationError(
                _(
                    "Invoices with VAT carry a rate above 0 %. A seller exempt from VAT (franchise) is not supported "
                    "yet."
                )
            )
        return rate

    def clean(self):
        cleaned = super().clean()
        for name, value in list(cleaned.items()):
            if isinstance(value, str) and not printable(value):
                self.add_error(name, NOT_PRINTABLE_MESSAGE)
        return cleaned


@admin.register(InvoicingSettings)
class InvoicingSettingsAdmin(SingletonAdmin):
    form = InvoicingSettingsForm
    fields = SETTINGS_FIELDS

    def save_model(self, request, obj, form, change):
        """Save, and record what changed (when each prefix and rate was in force) in the same transaction, the row
        locked as the documents being numbered lock it (payments/fiscal.py `_settings_locked`): the change waits for
        them, and its time in the history comes after every document issued under the previous settings."""
        with transaction.atomic():
            before = InvoicingSettings.objects.select_for_update().filter(pk=obj.pk).first() if change else None
            super().save_model(request, obj, form, change)
            self._record_change(request, obj, before)

    def _record_change(self, request, obj, before) -> None:
        changes = {
            name: [str(getattr(before, name)) if before else "", str(getattr(obj, name))]
            for name in SETTINGS_FIELDS
            if before is None or getattr(before, name) != getattr(obj, name)
        }
        if changes:
            InvoicingSettingsChange.objects.create(changed_at=timezone.now(), changed_by=request.user, changes=changes)


@admin.register(InvoicingSettingsChange)
class InvoicingSettingsChangeAdmin(ReadOnlyAdmin):
    """When each invoicing setting changed, and to what, read-only."""

    list_display = ["changed_at", "changed_by", "summary"]
    readonly_fields = ["changed_at", "changed_by", "changes"]

    @admin.display(description=_("changes"))
    def summary(self, obj: InvoicingSettingsChange) -> str:
        labels = {name: InvoicingSettings._meta.get_field(name).verbose_name for name in SETTINGS_FIELDS}
        return "; ".join(
            f"{labels.get(name, name)}: {before} → {after}" for name, (before, after) in obj.changes.items()
        )


@admin.register(FiscalInvoice)
class FiscalInvoiceAdmin(ReadOnlyAdmin):
    list_display = ["number", "kind", "issued_at", "order", "total_gross", "currency", "vat_category", "pdf_link"]
    list_filter = ["year", "prefix", "kind", "vat_category", "vat_rate"]
    search_fields = ["number", "order__public_id", "buyer__organisation"]
    exclude = ["pdf"]

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields if field.name != "pdf"] + ["pdf_link"]

    @admin.display(description=_("PDF"))
    def pdf_link(self, obj: FiscalInvoice) -> str:
        url = reverse("admin:payments_fiscalinvoice_pdf", args=[obj.pk])
        return format_html('<a href="{}">{}</a>', url, obj.filename)

    def get_urls(self):
        view = self.admin_site.admin_view(self.pdf_view)
        return [path("<int:pk>/pdf/", view, name="payments_fiscalinvoice_pdf"), *super().get_urls()]

    def pdf_view(self, request, pk: int) -> HttpResponse:
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        fiscal_invoice = FiscalInvoice.objects.filter(pk=pk).select_related("order").first()
        if fiscal_invoice is None:
            return HttpResponse(status=404)
        try:
            fiscal_invoice = fiscal_documents.fiscal_invoice_write_document(fiscal_invoice=fiscal_invoice)
        except fiscal_documents.DocumentNotPrintable as exc:
            self.message_user(
                request,
                _("The document of %(number)s cannot be printed: %(error)s")
                % {"number": fiscal_invoice.number, "error": exc.failure.error},
                messages.ERROR,
            )
            return redirect("admin:payments_fiscalinvoice_change", fiscal_invoice.pk)
        response = HttpResponse(bytes(fiscal_invoice.pdf), content_type="application/pdf")
        response["Content-Disposition"] = f'attachment; filename="{fiscal_invoice.filename}"'
        return response


@admin.register(FiscalInvoiceSeries)
class FiscalInvoiceSeriesAdmin(ReadOnlyAdmin):
    """The number series, one per prefix and year, read-only: the last number each issued (a prefix changed in the
    invoicing settings starts a new one; the documents issued under the earlier prefix keep theirs)."""

    list_display = ["prefix", "year", "last_sequence", "last_number"]
    list_filter = ["year"]

    @admin.display(description=_("last number"))
    def last_number(self, obj: FiscalInvoiceSeries) -> str:
        return f"{obj.prefix}-{obj.year}-{obj.last_sequence:06d}" if obj.last_sequence else "-"


@admin.register(FiscalDocumentFailure)
class FiscalDocumentFailureAdmin(admin.ModelAdmin):
    """Issued invoices whose document cannot be printed (beat's sweep no longer queues them). Deleting one, once its
    cause is fixed, lets the sweep print it again."""

    list_display = ["fiscal_invoice", "failed_at", "error"]
    readonly_fields = ["fiscal_invoice", "failed_at", "error"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
