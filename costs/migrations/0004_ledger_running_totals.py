"""Running totals beside the ledger: unknown-cost entries, rollups per job, a totals row per team, and indexes.

Ends by rebuilding every total from the ledger (``costs.rollups.rebuild_totals``).
"""

import django.db.models.deletion
from django.db import migrations, models


def rebuild(apps, schema_editor):
    from costs.rollups import rebuild_totals

    rebuild_totals(models=tuple(apps.get_model("costs", name)
                                for name in ("CostEntry", "DailyCostRollup", "JobDailyCost", "TeamSpend")))


class Migration(migrations.Migration):

    dependencies = [
        ('costs', '0003_report'),
        ('jobs', '0001_initial'),
        ('quotas', '0003_seed_priority_classes'),
        ('runners', '0002_cluster_credentials'),
    ]

    operations = [
        migrations.CreateModel(
            name='JobDailyCost',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('day', models.DateField()),
                ('gpu_seconds', models.DecimalField(decimal_places=6, max_digits=24)),
                ('cost_usd', models.DecimalField(decimal_places=9, max_digits=20)),
                ('unpriced_gpu_seconds', models.DecimalField(decimal_places=6, default=0, max_digits=24)),
                ('entries', models.PositiveIntegerField()),
                ('rebuilt_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'ordering': ['day', 'job_id'],
            },
        ),
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
        migrations.AddConstraint(
            model_name='costentry',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('amount_usd__isnull', True), ('usd_per_gpu_hour__isnull', True)), models.Q(('amount_usd__isnull', False), ('usd_per_gpu_hour__isnull', False)), _connector='OR'), name='costentry_priced_or_unknown'),
        ),
        migrations.AddField(
            model_name='jobdailycost',
            name='job',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='cost_rollups', to='jobs.job'),
        ),
        migrations.AddField(
            model_name='jobdailycost',
            name='team',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='job_cost_rollups', to='quotas.team'),
        ),
        migrations.AddIndex(
            model_name='jobdailycost',
            index=models.Index(fields=['team', 'day'], name='jobcost_team_day'),
        ),
        migrations.AddConstraint(
            model_name='jobdailycost',
            constraint=models.UniqueConstraint(fields=('day', 'job'), name='jobcost_unique'),
        ),
        migrations.RunPython(rebuild, migrations.RunPython.noop),
    ]
