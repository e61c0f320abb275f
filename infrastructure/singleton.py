"""Operator-edited settings kept as a single database row (pk=1): the booking policy, the operator settings."""

from typing import Self

from django.contrib import admin


class SingletonRow:
    """Mixin for a model whose only row has pk=1 (each model also carries a CheckConstraint pk=1)."""

    @classmethod
    def current(cls) -> Self:
        row, _created = cls.objects.get_or_create(pk=1)
        return row

    @classmethod
    def read(cls) -> Self:
        """The row, or its defaults unsaved when there is none yet: for pages that only read (no write on a GET)."""
        return cls.objects.filter(pk=1).first() or cls(pk=1)


class SingletonAdmin(admin.ModelAdmin):
    """The one row can be edited, never added twice nor deleted."""

    def has_add_permission(self, request):
        # The user's own add permission first: "no row yet" alone let any staff member create it.
        return super().has_add_permission(request) and not self.model.objects.exists()

    def has_delete_permission(self, request, obj=None):
        return False
