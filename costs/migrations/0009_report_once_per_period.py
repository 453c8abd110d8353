"""One report per scope, kind and period, mailed once: ``source``, ``requested_by``, ``mailed_at`` and the unique
constraints (``costs.models.Report``).

Before the constraints, duplicates that concurrent builds may have left are removed (the newest row of each key
stays), and every stored daily or weekly report is marked mailed at its generation: the code that made them
mailed each new one at once, so the catch-up (``costs.reports.catchup``) must not send them again.
"""

import django.db.models.deletion
import django.db.models.functions.comparison
from django.conf import settings
from django.db import migrations, models


def keep_one_and_mark_mailed(apps, schema_editor):
    Report = apps.get_model("costs", "Report")
    reports = Report.objects.using(schema_editor.connection.alias)
    seen, duplicates = set(), []
    for pk, team, kind, start, end in reports.order_by("-id").values_list(
            "pk", "team_id", "kind", "period_start", "period_end"):
        key = (team or 0, kind, start, end if kind == "custom" else None)
        if key in seen:
            duplicates.append(pk)
        seen.add(key)
    reports.filter(pk__in=duplicates).delete()
    reports.exclude(kind="custom").update(source="schedule", mailed_at=models.F("generated_at"))


class Migration(migrations.Migration):

    dependencies = [
        ('costs', '0008_costentry_reconstructed'),
        ('quotas', '0006_quota_vcpus'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='report',
            name='mailed_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='report',
            name='requested_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='report',
            name='source',
            field=models.CharField(choices=[('schedule', 'Schedule'), ('catch-up', 'Catch Up'), ('request', 'Request')], default='request', max_length=16),
        ),
        migrations.RunPython(keep_one_and_mark_mailed, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='report',
            constraint=models.UniqueConstraint(django.db.models.functions.comparison.Coalesce('team', models.Value(0)), models.F('kind'), models.F('period_start'), condition=models.Q(('kind', 'custom'), _negated=True), name='report_one_per_scope_period'),
        ),
        migrations.AddConstraint(
            model_name='report',
            constraint=models.UniqueConstraint(django.db.models.functions.comparison.Coalesce('team', models.Value(0)), models.F('period_start'), models.F('period_end'), condition=models.Q(('kind', 'custom')), name='report_one_custom_per_scope_window'),
        ),
    ]
