from django.db import migrations, models
from django.db.models import Sum


def credited_so_far(apps, schema_editor):
    """Until now the native balance read was compared with what was credited: start from there, so that nothing
    already credited is credited again."""
    Invoice = apps.get_model("payments", "Invoice")
    Transfer = apps.get_model("payments", "Transfer")
    rows = (
        Transfer.objects.filter(status="confirmed", token_contract="", invoice__asset_contract="")
        .values("invoice")
        .annotate(total=Sum("amount_units"))
    )
    for row in rows:
        Invoice.objects.filter(pk=row["invoice"]).update(native_balance_seen=row["total"])


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0004_transfer_block_time_payment_settings"),
    ]

    operations = [
        migrations.AddField(
            model_name="invoice",
            name="native_balance_seen",
            field=models.DecimalField(decimal_places=0, default=0, max_digits=78),
        ),
        migrations.RunPython(credited_so_far, migrations.RunPython.noop),
    ]
