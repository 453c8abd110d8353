"""Running totals beside the ledger: rollups per job too, unknown-cost entries, a totals row per team, and indexes.

The rollups are emptied before their key grows a job and rebuilt from the
ledger at the end (``costs.rollups.rebuild_totals``), with the team totals.
"""

import django.db.models.deletion
from django.db import migrations, models


def empty_rollups(apps, schema_editor):
    apps.get_model("costs", "DailyCostRollup").objects.all().delete()


def rebuild(apps, schema_editor):
    from costs.rollups import rebuild_totals

    rebuild_totals(models=(apps.get_model("costs", "CostEntry"), apps.get_model("costs", "DailyCostRollup"),
                           apps.get_model("costs", "TeamSpend")))


class Migration(migrations.Migration):

    dependencies = [
        ('costs', '0003_report'),
        ('jobs', '0001_initial'),
        ('quotas', '0003_seed_priority_classes'),
        ('runners', '0002_cluster_credentials'),
    ]

    operations = [
        migrations.CreateModel(
            name='TeamSpend',
            fields=[
                ('team', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='spend', serialize=False, to='quotas.team')),
                ('cost_usd', models.DecimalField(decimal_places=9, default=0, max_digits=24)),
                ('gpu_seconds', models.DecimalField(decimal_places=6, default=0, max_digits=28)),
                ('unpriced_gpu_seconds', models.DecimalField(decimal_places=6, default=0, max_digits=28)),
                ('entries', models.BigIntegerField(default=0)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
        ),
        migrations.RemoveConstraint(
            model_name='dailycostrollup',
            name='costrollup_unique',
        ),
        migrations.RunPython(empty_rollups, migrations.RunPython.noop),
        migrations.AddField(
            model_name='dailycostrollup',
            name='job',
            field=models.ForeignKey(default=None, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='cost_rollups', to='jobs.job'),
        ),
        migrations.AlterField(
            model_name='dailycostrollup',
            name='job',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='cost_rollups', to='jobs.job'),
        ),
        migrations.AddField(
            model_name='dailycostrollup',
            name='unpriced_gpu_seconds',
            field=models.DecimalField(decimal_places=6, default=0, max_digits=24),
        ),
        migrations.AlterField(
            model_name='costentry',
            name='amount_usd',
            field=models.DecimalField(blank=True, decimal_places=9, max_digits=20, null=True),
        ),
        migrations.AlterField(
            model_name='costentry',
            name='usd_per_gpu_hour',
            field=models.DecimalField(blank=True, decimal_places=6, help_text='null: no price was in force (cost unknown)', max_digits=12, null=True),
        ),
        migrations.AddIndex(
            model_name='costentry',
            index=models.Index(fields=['interval_start'], name='costentry_start'),
        ),
        migrations.AddIndex(
            model_name='costentry',
            index=models.Index(condition=models.Q(('usd_per_gpu_hour__isnull', True)), fields=['team', 'job', 'interval_start'], name='costentry_unpriced'),
        ),
        migrations.AddIndex(
            model_name='dailycostrollup',
            index=models.Index(fields=['team', 'day'], name='costrollup_team_day'),
        ),
        migrations.AddIndex(
            model_name='dailycostrollup',
            index=models.Index(fields=['day'], name='costrollup_day'),
        ),
        migrations.AddConstraint(
            model_name='costentry',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('amount_usd__isnull', True), ('usd_per_gpu_hour__isnull', True)), models.Q(('amount_usd__isnull', False), ('usd_per_gpu_hour__isnull', False)), _connector='OR'), name='costentry_priced_or_unknown'),
        ),
        migrations.AddConstraint(
            model_name='dailycostrollup',
            constraint=models.UniqueConstraint(fields=('day', 'team', 'cluster', 'accelerator', 'job'), name='costrollup_unique'),
        ),
        migrations.RunPython(rebuild, migrations.RunPython.noop),
    ]
