"""Seed the price table with Lab's default list prices (``billing.defaults``)."""

from django.db import migrations

from billing.defaults import seed_default_prices


def seed(apps, schema_editor):
    seed_default_prices(apps.get_model("billing", "Price"))


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
