"""UtilizationRollup keeps its watermark (``covered_until``), whether its day was re-read whole (``sealed``), and the
memory sum and profiling-counter samples that make its figures additive over adjacent windows."""

from django.db import migrations, models
from django.db.models import F, Q


def backfill(apps, schema_editor):
    """Memory sums from the stored averages; profiling samples where the row's counter was the profiling one. The
    watermark stays null: the coverage of an existing row is not known, so a periodic pass reads it whole once."""
    rollup = apps.get_model("costs", "UtilizationRollup")
    rollup.objects.filter(memory_samples__gt=0, avg_memory_used_mib__isnull=False).update(
        memory_sum=F("avg_memory_used_mib") * F("memory_samples"))
    rollup.objects.filter(Q(util_metric="DCGM_FI_PROF_GR_ENGINE_ACTIVE")).update(prof_samples=F("samples"))


class Migration(migrations.Migration):

    dependencies = [
        ('costs', '0011_attempt_daily_cost'),
    ]

    operations = [
        migrations.AddField(
            model_name='utilizationrollup',
            name='memory_sum',
            field=models.FloatField(default=0.0, help_text='sum of GPU memory samples, MiB'),
        ),
        migrations.AddField(
            model_name='utilizationrollup',
            name='prof_samples',
            field=models.PositiveIntegerField(default=0, help_text='samples read from DCGM_FI_PROF_GR_ENGINE_ACTIVE'),
        ),
        migrations.AddField(
            model_name='utilizationrollup',
            name='covered_until',
            field=models.DateTimeField(blank=True, help_text="the sums hold the day's part of the run up to here; null: unknown", null=True),
        ),
        migrations.AddField(
            model_name='utilizationrollup',
            name='sealed',
            field=models.BooleanField(default=False, help_text="re-read whole once the day's part had settled"),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
