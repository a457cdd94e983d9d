import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0013_model_store_and_builds'),
        ('sandboxes', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='sandbox',
            name='attempt',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='sandboxes', to='jobs.jobattempt'),
        ),
    ]
