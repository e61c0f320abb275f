from django.db import migrations
from django.db.models import Sum


def backfill(apps, schema_editor):
    """Orders extended before Order.extensions_price existed: their settled extension invoices' price, so that a
    cancellation quotes (and refunds) the extensions by the same rules as the booking."""
    Invoice = apps.get_model("payments", "Invoice")
    Order = apps.get_model("booking", "Order")
    paid = (
        Invoice.objects.filter(purpose="extension", status="settled")
        .values("order_id")
        .annotate(total=Sum("fiat_amount"))
    )
    for row in paid:
        Order.objects.filter(pk=row["order_id"]).update(extensions_price=row["total"])


class Migration(migrations.Migration):
    dependencies = [
        ("booking", "0011_order_extensions_price"),
        ("payments", "0005_merge_0003_refunds_0004_fiscal_invoice_immutable"),
    ]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
