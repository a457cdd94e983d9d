"""The uid of the pool's pod that holds a sandbox: its agent's key is derived from it."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sandboxes', '0004_sandbox_pod'),
    ]

    operations = [
        migrations.AddField(
            model_name='sandbox',
            name='pod_uid',
            field=models.CharField(blank=True, max_length=64),
        ),
    ]
