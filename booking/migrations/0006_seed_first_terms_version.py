"""A fresh database starts with a published first terms version (demo text, marked as such), so the terms pages and
the booking form work before the operator writes their own."""

from django.db import migrations
from django.utils import timezone

from booking.terms_demo import FIRST_VERSION


def seed(apps, schema_editor):
    TermsVersion = apps.get_model("booking", "TermsVersion")
    if not TermsVersion.objects.filter(published_at__isnull=False).exists():
        TermsVersion.objects.create(number=1, published_at=timezone.now(), **FIRST_VERSION)


class Migration(migrations.Migration):
    dependencies = [("booking", "0005_terms_version")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
