from django.contrib import admin
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from portal.singleton import SingletonAdmin
from provisioning.models import Access, Host, OperatorSettings, ProvisioningRun, ProvisioningStep
from provisioning.views import report_host_check


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ["name", "address", "ssh_port", "driver", "isolation_mode", "isolation_checked_at", "is_active"]
    list_filter = ["driver", "isolation_mode", "is_active"]
    search_fields = ["name", "address"]
    actions = ["check_hosts"]
    fieldsets = [
        (
            None,
            {"fields": ["name", "address", "ssh_port", "driver", "admin_user", "use_sudo", "host_key", "is_active"]},
        ),
        (
            _("Each lot's container"),
            {
                "fields": [
                    "container_runtime",
                    "ssh_port_base",
                    "cpus_per_lot",
                    "memory_per_lot_gib",
                    "shm_size_gib",
                    "disk_per_lot_gib",
                ]
            },
        ),
        (
            _("Isolation (found by checking the host)"),
            {"fields": ["isolation_mode", "isolation_checked_at", "isolation_report", "exclusive_lot"]},
        ),
        (None, {"fields": ["notes"]}),
    ]
    readonly_fields = ["isolation_mode", "isolation_checked_at", "isolation_report", "exclusive_lot"]

    @admin.action(description=_("Check the selected hosts' isolation"), permissions=["change"])
    def check_hosts(self, request: HttpRequest, queryset) -> None:
        for host in queryset[:50]:  # each check is an SSH session: a bounded batch per click
            report_host_check(request, host)


@admin.register(OperatorSettings)
class OperatorSettingsAdmin(SingletonAdmin):
    list_display = ["__str__", "auto_approve", "provision_lead_hours", "wipe_after_days"]


class StepInline(admin.TabularInline):
    model = ProvisioningStep
    extra = 0
    can_delete = False
    fields = ["position", "name", "host", "status", "attempts", "started_at", "finished_at", "output", "error"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(ProvisioningRun)
class ProvisioningRunAdmin(admin.ModelAdmin):
    list_display = ["order", "kind", "status", "created_at", "finished_at", "attempts", "next_retry_at", "triggered_by"]
    list_filter = ["kind", "status"]
    inlines = [StepInline]
    readonly_fields = [field.name for field in ProvisioningRun._meta.fields]

    def has_add_permission(self, request):
        return False


@admin.register(Access)
class AccessAdmin(admin.ModelAdmin):
    list_display = ["order", "host", "username", "gpu_indices", "status", "preflight_status", "ready_at", "revoked_at"]
    list_filter = ["status", "preflight_status"]
    readonly_fields = [field.name for field in Access._meta.fields]

    def has_add_permission(self, request):
        return False
