"""What the admins of several apps share."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """A record the system writes and nobody edits (an audit trail, what was said or paid): listed and opened, never
    added, changed or deleted in the admin."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
