from django.contrib import admin

from provisioning.models import Host


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ["name", "address", "ssh_port", "driver", "is_active"]
    list_filter = ["driver", "is_active"]
    search_fields = ["name", "address"]
