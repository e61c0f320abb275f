"""Django admin: raw data. The catalog is editable; orders are read here and changed only through services."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import BooleanField, ExpressionWrapper
from django.http import HttpRequest
from django.shortcuts import redirect
from django.utils.translation import gettext_lazy as _

from booking import terms
from booking.models import (
    Allocation,
    BookingPolicy,
    EnvironmentImage,
    Order,
    OrderEvent,
    OrderSshKey,
    Price,
    TermsPublished,
    TermsVersion,
)
from booking.selectors import OFFERED_LOT, offered_lots
from infrastructure.admin import ReadOnlyAdmin
from infrastructure.singleton import SingletonAdmin
from inventory.models import HardwareClass, Lot


class PriceInline(admin.TabularInline):
    model = Price
    extra = 0


@admin.register(HardwareClass)
class HardwareClassAdmin(admin.ModelAdmin):
    list_display = ["name", "vendor", "memory_per_card_gb", "cards_per_lot", "architecture", "is_default", "is_active"]
    list_filter = ["vendor", "is_active"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [PriceInline]


class EnvironmentImageForm(forms.ModelForm):
    class Meta:
        model = EnvironmentImage
        fields = [
            "slug",
            "name",
            "image_ref",
            "runtime",
            "runtime_version",
            "pytorch_version",
            "hardware_classes",
            "is_active",
            "position",
        ]

    def clean(self):
        cleaned = super().clean()
        runtime, version = cleaned.get("runtime"), cleaned.get("runtime_version")
        if runtime and version:
            probe = EnvironmentImage(name=cleaned.get("name") or "", runtime=runtime, runtime_version=version)
            problems = [
                reason
                for hardware_class in cleaned.get("hardware_classes") or []
                if (reason := probe.incompatibility_with(hardware_class))
            ]
            if problems:
                self.add_error("hardware_classes", problems)
        return cleaned


@admin.register(EnvironmentImage)
class EnvironmentImageAdmin(admin.ModelAdmin):
    form = EnvironmentImageForm
    list_display = ["name", "image_ref", "runtime", "runtime_version", "pytorch_version", "is_active"]
    list_filter = ["runtime", "is_active"]
    filter_horizontal = ["hardware_classes"]
    prepopulated_fields = {"slug": ["name"]}


@admin.register(Lot)
class LotAdmin(admin.ModelAdmin):
    list_display = ["name", "hardware_class", "host", "gpu_indices", "status", "offered"]
    list_filter = ["hardware_class", "status", "host"]
    list_select_related = ["hardware_class", "host"]
    search_fields = ["name", "host__name"]

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).annotate(is_offered=ExpressionWrapper(OFFERED_LOT, BooleanField()))

    @admin.display(boolean=True, description=_("offered to customers"), ordering="is_offered")
    def offered(self, lot: Lot) -> bool:
        return lot.is_offered

    def save_model(self, request: HttpRequest, obj: Lot, form, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if obj.status == Lot.Status.ACTIVE and not obj.host.is_active:
            message = _("Lot %(lot)s is active but not offered to customers: its host %(host)s is inactive.")
            messages.warning(request, message % {"lot": obj.name, "host": obj.host.name})
        elif obj.status == Lot.Status.ACTIVE and not offered_lots().filter(pk=obj.pk).exists():
            # The host's isolation (provisioning's "check host") decides; say why and what to do.
            message = _(
                "%(lot)s is active but not offered to customers: its host %(host)s is in the isolation mode "
                "“%(mode)s”. Make the host isolated (a container runtime, GPU device nodes closed to others, or a "
                "single lot), then check it again in the console's Hosts page."
            )
            values = {"lot": obj.name, "host": obj.host.name, "mode": obj.host.get_isolation_mode_display()}
            messages.warning(request, message % values)


@admin.register(BookingPolicy)
class BookingPolicyAdmin(SingletonAdmin):
    list_display = [
        "__str__",
        "turnaround_hours",
        "hold_minutes",
        "min_notice_hours",
        "offer_start_when_ready",
        "horizon_days",
        "max_unpaid_lots_per_client",
        "unconfirmed_share_percent",
    ]


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class OrderEventInline(ReadOnlyInline):
    model = OrderEvent
    fields = ["created_at", "from_status", "to_status", "actor_kind", "actor", "reason", "evidence"]
    readonly_fields = fields


class AllocationInline(ReadOnlyInline):
    model = Allocation
    fields = ["lot", "starts_at", "ends_at", "released_at"]
    readonly_fields = fields


class OrderSshKeyInline(ReadOnlyInline):
    model = OrderSshKey
    fields = ["key_type", "bits", "fingerprint", "public_key"]
    readonly_fields = fields


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    """Orders are read here; their status changes only through services (console, tasks), never by hand."""

    list_display = [
        "public_id",
        "status",
        "hardware_class",
        "lot_count",
        "starts_at",
        "days",
        "total_price",
        "currency",
        "contact_email",
        "created_at",
    ]
    list_filter = ["status", "hardware_class", "days"]
    list_select_related = ["hardware_class"]
    search_fields = ["public_id", "contact_email", "contact_name", "organisation"]
    date_hierarchy = "created_at"
    inlines = [AllocationInline, OrderSshKeyInline, OrderEventInline]
    readonly_fields = [field.name for field in Order._meta.fields]
    fieldsets = [
        (None, {"fields": ["public_id", "status", "hold_expires_at", "created_at", "updated_at", "language"]}),
        (_("Booking"), {"fields": ["hardware_class", "environment", "lot_count", "days", "starts_at", "ends_at"]}),
        (_("Price"), {"fields": ["currency", "price_per_lot", "total_price"]}),
        (_("Contact"), {"fields": ["contact_name", "contact_email", "organisation", "messenger"]}),
        (_("Research"), {"fields": ["hypothesis", "hypothesis_detail", "notes"]}),
    ]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(OrderEvent)
class OrderEventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "order", "from_status", "to_status", "actor_kind", "actor", "reason"]
    list_filter = ["to_status", "actor_kind"]
    list_select_related = ["order", "actor"]
    search_fields = ["order__public_id", "reason"]


@admin.register(TermsVersion)
class TermsVersionAdmin(admin.ModelAdmin):
    """Drafts are edited, then published (an action); a published version is read-only and cannot be deleted: a
    change is a new draft made from it ("New draft from this version"), published in turn."""

    list_display = ["__str__", "number", "published_at", "created_at"]
    actions = ["publish", "new_draft"]
    fieldsets = [
        (_("Terms of sale"), {"fields": ["terms_en", "terms_fr"]}),
        (
            _("Cancellation and refund policy"),
            {
                "fields": [
                    "cancellation_en",
                    "cancellation_fr",
                    "full_refund_days_before",
                    "cancellation_fee",
                    "partial_refund_percent",
                ]
            },
        ),
        (_("Legal notice"), {"fields": ["legal_en", "legal_fr"]}),
        (_("Privacy notice"), {"fields": ["privacy_en", "privacy_fr"]}),
        (_("Publication"), {"fields": ["number", "published_at"]}),
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: TermsVersion | None = None) -> list[str]:
        if obj is not None and obj.is_published:
            return [field.name for field in TermsVersion._meta.fields if field.name != "id"]
        return ["number", "published_at"]

    def has_change_permission(self, request: HttpRequest, obj: TermsVersion | None = None) -> bool:
        # A published version is shown (view permission), never saved: its form has no save button.
        if obj is not None and obj.is_published:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: TermsVersion | None = None) -> bool:
        if obj is not None and obj.is_published:
            return False
        return super().has_delete_permission(request, obj)

    def changeform_view(self, request: HttpRequest, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except TermsPublished:
            return self._published_meanwhile(request, object_id)

    def delete_view(self, request: HttpRequest, object_id, extra_context=None):
        try:
            return super().delete_view(request, object_id, extra_context)
        except TermsPublished:
            return self._published_meanwhile(request, object_id)

    def _published_meanwhile(self, request: HttpRequest, object_id):
        # Another admin published this draft while the form was open: nothing of this form was written (the
        # view's transaction rolled back), and the version is shown again, published and read-only.
        self.message_user(
            request,
            _(
                "This version was published while you were editing it: your changes were not saved. Make a new "
                "draft from it to change the terms."
            ),
            messages.ERROR,
        )
        return redirect("admin:booking_termsversion_change", object_id)

    def get_actions(self, request: HttpRequest):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # a bulk delete would bypass the per-row guard on published versions
        return actions

    def changelist_view(self, request: HttpRequest, extra_context=None):
        # An action this user is not offered (it needs a permission they lack) is refused outright, rather than the
        # changelist shown again as if nothing had been posted.
        action = request.POST.get("action") if request.method == "POST" else None
        if action and action not in self.get_actions(request):
            raise PermissionDenied
        return super().changelist_view(request, extra_context)

    # Publishing changes the terms every new order accepts: the change permission, as the edit form; a new draft is
    # a new row: the add permission. Django hides and refuses an action the user lacks the permission for.
    @admin.action(description=_("Publish the selected draft (it becomes the current version)"), permissions=["change"])
    def publish(self, request: HttpRequest, queryset) -> None:
        drafts = list(queryset.filter(published_at__isnull=True).order_by("created_at"))
        if len(drafts) != 1 or queryset.count() != 1:
            self.message_user(request, _("Select exactly one draft to publish."), messages.ERROR)
            return
        try:
            version = terms.terms_publish(version=drafts[0])
        except TermsPublished:  # another admin published it first
            self.message_user(request, _("This draft was published meanwhile by someone else."), messages.ERROR)
            return
        self.message_user(
            request, _("Version %(number)s is published and is now the current one.") % {"number": version.number}
        )

    @admin.action(description=_("New draft from this version"), permissions=["add"])
    def new_draft(self, request: HttpRequest, queryset) -> None:
        if queryset.count() != 1:
            self.message_user(request, _("Select exactly one version to copy."), messages.ERROR)
            return
        terms.terms_draft_from(version=queryset.get())
        self.message_user(request, _("A new draft was made: edit it, then publish it."))
