"""Whether a sandbox's usage is on the billing ledger to its end. Sandboxes that ended before
sandboxes were billed are marked closed: they are not billed after the fact."""

from django.db import migrations, models


def close_ended(apps, schema_editor):
    apps.get_model("sandboxes", "Sandbox").objects.filter(status__in=("stopped", "failed")).update(usage_closed=True)


class Migration(migrations.Migration):

    dependencies = [
        ('sandboxes', '0002_sandbox_attempt'),
    ]

    operations = [
        migrations.AddField(
            model_name='sandbox',
            name='usage_closed',
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(close_ended, migrations.RunPython.noop),
    ]
