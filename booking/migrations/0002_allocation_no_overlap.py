"""Overbooking made impossible by PostgreSQL: no two live allocations of one lot whose periods overlap.

An exclusion constraint (btree_gist: lot `=`, period `&&`) limited to live rows (released_at IS NULL). SQLite, the
embedded development default, has no exclusion constraints: there, bookings are serialised by IMMEDIATE
transactions (settings.py) and the service's own check.
"""

from django.db import migrations

CREATE = """
CREATE EXTENSION IF NOT EXISTS btree_gist;
ALTER TABLE booking_allocation ADD CONSTRAINT allocation_no_overlap
    EXCLUDE USING gist (lot_id WITH =, tstzrange(starts_at, ends_at, '[)') WITH &&)
    WHERE (released_at IS NULL);
"""
DROP = "ALTER TABLE booking_allocation DROP CONSTRAINT IF EXISTS allocation_no_overlap;"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("booking", "0001_initial")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
