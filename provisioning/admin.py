from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from infrastructure.admin import ReadOnlyAdmin
from infrastructure.singleton import SingletonAdmin
from inventory.models import Host, MaintenanceWindow
from provisioning import hosts
from provisioning.models import Access, OperatorSettings, ProvisioningRun, ProvisioningStep, WatchAlert


def request_host_checks(request: HttpRequest, hosts_: list[Host]) -> None:
    """Queue "check host" for each host and tell the operator where to read the results (console and admin)."""
    queued = [host.name for host in hosts_ if hosts.host_check_request(host=host, actor=request.user)]
    already = [host.name for host in hosts_ if host.name not in queued]
    if queued:
        messages.info(
            request,
            _(
                "Check queued for %(hosts)s: a worker runs it over SSH, and each host's page in the console shows "
                "where it stands and what it found."
            )
            % {"hosts": ", ".join(queued)},
        )
    if already:
        messages.info(request, _("A check is already under way for %(hosts)s.") % {"hosts": ", ".join(already)})


class MaintenanceWindowInline(admin.TabularInline):
    model = MaintenanceWindow
    extra = 1
    fields = ["starts_at", "ends_at", "reason"]


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    inlines = [MaintenanceWindowInline]
    list_display = [
        "name",
        "address",
        "ssh_port",
        "driver",
        "isolation_mode",
        "isolation_checked_at",
        "health_status",
        "ready_within_minutes",
        "is_active",
    ]
    list_filter = ["driver", "isolation_mode", "is_active"]
    search_fields = ["name", "address"]
    actions = ["check_hosts"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "name",
                    "address",
                    "ssh_port",
                    "driver",
                    "admin_user",
                    "use_sudo",
                    "host_key",
                    "is_active",
                    "ready_within_minutes",
                ]
            },
        ),
        (
            gettext_lazy("Each lot's container"),
            {
                "fields": [
                    "container_runtime",
                    "ssh_port_base",
                    "cpus_per_lot",
                    "memory_per_lot_gib",
                    "shm_size_gib",
                    "disk_per_lot_gib",
                    "connections_per_lot",
                    "ptys_per_lot",
                    "disk_mbps_per_lot",
                ]
            },
        ),
        (
            gettext_lazy("Isolation (found by checking the host)"),
            {"fields": ["isolation_mode", "isolation_checked_at", "isolation_report", "exclusive_lot"]},
        ),
        (
            gettext_lazy("Health (checked while windows run)"),
            {"fields": ["health_status", "health_checked_at", "health_report"]},
        ),
        (None, {"fields": ["notes"]}),
    ]
    readonly_fields = [
        "isolation_mode",
        "isolation_checked_at",
        "isolation_report",
        "exclusive_lot",
        "health_status",
        "health_checked_at",
        "health_report",
    ]

    @admin.action(description=gettext_lazy("Check the selected hosts' isolation"), permissions=["change"])
    def check_hosts(self, request: HttpRequest, queryset) -> None:
        request_host_checks(request, list(queryset[:50]))  # each check is an SSH session: a bounded batch


@admin.register(OperatorSettings)
class OperatorSettingsAdmin(SingletonAdmin):
    list_display = ["__str__", "auto_approve", "approval_response_hours", "provision_lead_hours", "wipe_after_days"]


@admin.register(WatchAlert)
class WatchAlertAdmin(ReadOnlyAdmin):
    """What the readings' watch said to researchers (provisioning/watch.py): read-only, the watch writes them."""

    list_display = ["order", "kind", "started_at", "last_seen_at", "ended_at", "mailed_at"]
    list_filter = ["kind", ("ended_at", admin.EmptyFieldListFilter)]
    search_fields = ["order__public_id"]
    list_select_related = ["order"]


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
