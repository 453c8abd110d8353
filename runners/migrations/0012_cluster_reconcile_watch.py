from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runners', '0011_cluster_reconcile_lease'),
    ]

    operations = [
        migrations.AddField(
            model_name='cluster',
            name='reconcile_watch',
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
