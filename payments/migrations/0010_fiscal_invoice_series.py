"""Each invoice number prefix has its own gapless series per year (`FiscalInvoiceSeries`, keyed by prefix and year),
where one counter per year continued under whatever prefix was set: an issued document now records its prefix, and
the unique constraint is (prefix, year, sequence).

Issued documents keep their numbers: each gets the prefix its number was written with, and each (prefix, year)
series starts from the highest sequence issued under it, so no number is taken twice. A year in which the prefix
was changed before this migration keeps the numbers it issued (the new prefix's first one may not be 1).

The changes the operator makes to the invoicing settings are recorded from now on (`InvoicingSettingsChange`): when
each prefix and rate was in force.

The prefix of issued rows is written with the immutability trigger (migration 0004) disabled for that one
statement, in this migration's transaction: nothing else of an issued row changes."""

import django.core.validators
import django.db.models.deletion
from decimal import Decimal
from django.conf import settings
from django.db import migrations, models
from django.db.models import Max

NUMBER_TAIL = r"-[0-9]{4}-[0-9]+$"  # PREFIX-YEAR-SEQUENCE: the prefix is what precedes the last two parts


def prefix_of(number: str) -> str:
    return number.rsplit("-", 2)[0]


def fill_prefixes(apps, schema_editor):
    FiscalInvoice = apps.get_model("payments", "FiscalInvoice")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE payments_fiscalinvoice DISABLE TRIGGER payments_fiscal_invoice_immutable")
        schema_editor.execute(
            "UPDATE payments_fiscalinvoice SET prefix = regexp_replace(number, %s, '')", params=[NUMBER_TAIL]
        )
        schema_editor.execute("ALTER TABLE payments_fiscalinvoice ENABLE TRIGGER payments_fiscal_invoice_immutable")
    else:
        for pk, number in FiscalInvoice.objects.values_list("pk", "number"):
            FiscalInvoice.objects.filter(pk=pk).update(prefix=prefix_of(number))


def fill_series(apps, schema_editor):
    FiscalInvoice = apps.get_model("payments", "FiscalInvoice")
    FiscalInvoiceSeries = apps.get_model("payments", "FiscalInvoiceSeries")
    issued = FiscalInvoice.objects.values("prefix", "year").annotate(last=Max("sequence"))
    FiscalInvoiceSeries.objects.bulk_create(
        FiscalInvoiceSeries(prefix=row["prefix"], year=row["year"], last_sequence=row["last"]) for row in issued
    )


class Migration(migrations.Migration):

    dependencies = [
        ("payments", "0009_merge_20261204_1924"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="fiscalinvoice",
            name="prefix",
            field=models.CharField(default="", max_length=8, verbose_name="number prefix"),
            preserve_default=False,
        ),
        migrations.RunPython(fill_prefixes, migrations.RunPython.noop, elidable=False),
        migrations.RemoveConstraint(
            model_name="fiscalinvoice",
            name="fiscal_invoice_number_once_a_year",
        ),
        migrations.AddConstraint(
            model_name="fiscalinvoice",
            constraint=models.UniqueConstraint(
                fields=("prefix", "year", "sequence"), name="fiscal_invoice_number_once_a_series"
            ),
        ),
        migrations.CreateModel(
            name="FiscalInvoiceSeries",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("prefix", models.CharField(max_length=8, verbose_name="number prefix")),
                ("year", models.PositiveSmallIntegerField(verbose_name="year")),
                ("last_sequence", models.PositiveIntegerField(default=0, verbose_name="last number issued")),
            ],
            options={
                "verbose_name": "invoice number series",
                "verbose_name_plural": "invoice number series",
                "ordering": ["-year", "prefix"],
                "constraints": [
                    models.UniqueConstraint(fields=("prefix", "year"), name="fiscal_invoice_series_once"),
                ],
            },
        ),
        migrations.RunPython(fill_series, migrations.RunPython.noop, elidable=False),
        migrations.DeleteModel(
            name="FiscalInvoiceCounter",
        ),
        migrations.CreateModel(
            name="InvoicingSettingsChange",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("changed_at", models.DateTimeField(verbose_name="changed")),
                ("changes", models.JSONField(verbose_name="changes")),
                (
                    "changed_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="changed by",
                    ),
                ),
            ],
            options={
                "verbose_name": "invoicing settings change",
                "verbose_name_plural": "invoicing settings history",
                "ordering": ["-changed_at", "-pk"],
            },
        ),
        migrations.AlterField(
            model_name="invoicingsettings",
            name="number_prefix",
            field=models.CharField(
                default="F",
                help_text="Invoice numbers read PREFIX-YEAR-SEQUENCE, e.g. F-2026-000042. Each prefix numbers its own "
                "documents from 1 each year, without gaps: a new prefix starts a new series, and issued documents "
                "keep theirs.",
                max_length=8,
                verbose_name="invoice number prefix",
            ),
        ),
        migrations.AlterField(
            model_name="invoicingsettings",
            name="vat_rate_percent",
            field=models.DecimalField(
                decimal_places=2,
                default=Decimal("20.00"),
                help_text="The rate included in the prices where VAT is due (buyers in the seller's country, and EU "
                "buyers without a VAT number). Reverse-charge and non-EU buyers pay the same price with no VAT in "
                "it. A new rate applies to the invoices issued after the change; issued ones, and the credit notes "
                "that correct them, keep the rate they were issued at.",
                max_digits=5,
                validators=[
                    django.core.validators.MinValueValidator(Decimal("0")),
                    django.core.validators.MaxValueValidator(Decimal("100")),
                ],
                verbose_name="VAT rate (%)",
            ),
        ),
    ]
