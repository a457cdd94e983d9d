"""Meter-event markers get a claim lease, the time of their first request, and the
``unconfirmed`` state (billing.metering); markers already requested count from their creation,
which the previous code wrote right before the first request."""

from django.db import migrations, models
from django.db.models import F


def requested_when_created(apps, schema_editor):
    MeterEvent = apps.get_model("billing", "MeterEvent")
    MeterEvent.objects.filter(attempts__gt=0, requested_at__isnull=True).update(requested_at=F("created_at"))


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0006_seed_price_history"),
    ]

    operations = [
        migrations.AddField(
            model_name="meterevent",
            name="requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="meterevent",
            name="claimed_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="meterevent",
            name="state",
            field=models.CharField(
                choices=[("sending", "Sending"), ("sent", "Sent"), ("unconfirmed", "Unconfirmed")],
                default="sending",
                max_length=12,
            ),
        ),
        migrations.RunPython(requested_when_created, migrations.RunPython.noop),
    ]
