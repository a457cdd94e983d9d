"""Give every existing price its first history entry (``billing.defaults.seed_price_history``)."""

from django.db import migrations

from billing.defaults import seed_price_history


def seed(apps, schema_editor):
    seed_price_history(apps.get_model("billing", "Price"), apps.get_model("billing", "PriceChange"))


class Migration(migrations.Migration):
    dependencies = [("billing", "0005_stripe_events_and_meter")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
