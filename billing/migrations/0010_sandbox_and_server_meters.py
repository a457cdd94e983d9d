"""Meter the ledger's intervals per kind (job attempts, sandboxes' cores and memory, dedicated
inference servers) and seed the sandbox prices (``billing.defaults``)."""

from django.db import migrations, models

from billing.defaults import seed_default_prices, seed_price_history


def seed_sandbox_prices(apps, schema_editor):
    price, change = apps.get_model("billing", "Price"), apps.get_model("billing", "PriceChange")
    seed_default_prices(price)
    seed_price_history(price, change)


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0009_token_usage_latency'),
        ('lab', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='usageinterval',
            name='deployment_public_id',
            field=models.CharField(blank=True, max_length=40),
        ),
        migrations.AddField(
            model_name='usageinterval',
            name='memory_gb_seconds',
            field=models.DecimalField(decimal_places=6, default=0, max_digits=18),
        ),
        migrations.AddField(
            model_name='usageinterval',
            name='meter',
            field=models.CharField(choices=[('attempt', 'Attempt'), ('sandbox_cpu', 'Sandbox Cpu'), ('sandbox_memory', 'Sandbox Memory'), ('server', 'Server')], default='attempt', max_length=16),
        ),
        migrations.AddField(
            model_name='usageinterval',
            name='sandbox_public_id',
            field=models.CharField(blank=True, max_length=40),
        ),
        migrations.AlterField(
            model_name='usageinterval',
            name='job_public_id',
            field=models.CharField(blank=True, max_length=40),
        ),
        migrations.AlterField(
            model_name='usageinterval',
            name='units',
            field=models.DecimalField(decimal_places=4, max_digits=10),
        ),
        migrations.AddIndex(
            model_name='usageinterval',
            index=models.Index(fields=['deployment_public_id'], name='usage_deployment'),
        ),
        migrations.AddConstraint(
            model_name='usageinterval',
            constraint=models.UniqueConstraint(fields=('meter', 'attempt_id', 'index'), name='usage_interval_once_per_meter'),
        ),
        migrations.RemoveConstraint(
            model_name='usageinterval',
            name='usage_interval_once',
        ),
        migrations.RunPython(seed_sandbox_prices, migrations.RunPython.noop),
    ]
