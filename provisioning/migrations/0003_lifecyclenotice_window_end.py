from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def notices_at_current_end(apps, schema_editor):
    LifecycleNotice = apps.get_model("provisioning", "LifecycleNotice")
    Order = apps.get_model("booking", "Order")
    LifecycleNotice.objects.update(
        window_end=Subquery(Order.objects.filter(pk=OuterRef("order_id")).values("ends_at")[:1])
    )


class Migration(migrations.Migration):
    dependencies = [
        ("booking", "0001_initial"),
        ("provisioning", "0002_host_admin_user_host_container_runtime_host_host_key_and_more"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="lifecyclenotice", name="one_notice_per_kind"),
        migrations.AddField(model_name="lifecyclenotice", name="window_end", field=models.DateTimeField(null=True)),
        migrations.RunPython(notices_at_current_end, migrations.RunPython.noop),
        migrations.AlterField(model_name="lifecyclenotice", name="window_end", field=models.DateTimeField()),
        migrations.AddConstraint(
            model_name="lifecyclenotice",
            constraint=models.UniqueConstraint(
                fields=("order", "kind", "window_end"), name="one_notice_per_kind_and_end"
            ),
        ),
    ]
