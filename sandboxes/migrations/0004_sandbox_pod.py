"""The pod of the Kubernetes sandbox pool that holds a sandbox, and its agent's URL."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sandboxes', '0003_sandbox_usage_closed'),
    ]

    operations = [
        migrations.AddField(
            model_name='sandbox',
            name='pod_name',
            field=models.CharField(blank=True, max_length=253),
        ),
        migrations.AddField(
            model_name='sandbox',
            name='agent_url',
            field=models.CharField(blank=True, max_length=300),
        ),
    ]
