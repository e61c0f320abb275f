from django.contrib import admin

from portal.singleton import SingletonAdmin
from provisioning.models import Access, Host, OperatorSettings, ProvisioningRun, ProvisioningStep


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ["name", "address", "ssh_port", "driver", "admin_user", "is_active"]
    list_filter = ["driver", "is_active"]
    search_fields = ["name", "address"]


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
    list_display = ["order", "kind", "status", "created_at", "finished_at", "triggered_by"]
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
