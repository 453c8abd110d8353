"""The Report model belongs to costs (``costs.models``, used by ``costs.reports``); its table ``frontend_report`` stays.

State only: the table was created by ``frontend.0001_initial``. The model's
content type (and with it the admin permissions given on reports) is
relabelled from ``frontend`` to ``costs``.
"""

import django.db.models.deletion
from django.db import migrations, models


def relabel_content_type(apps, schema_editor, old="frontend", new="costs"):
    ContentType = apps.get_model("contenttypes", "ContentType")
    types = ContentType.objects.using(schema_editor.connection.alias)
    if not types.filter(app_label=new, model="report").exists():
        types.filter(app_label=old, model="report").update(app_label=new)


def unrelabel_content_type(apps, schema_editor):
    relabel_content_type(apps, schema_editor, old="costs", new="frontend")


class Migration(migrations.Migration):

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('costs', '0002_rollups_alerts_utilization'),
        ('frontend', '0001_initial'),
        ('quotas', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Report',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(choices=[('daily', 'Daily'), ('weekly', 'Weekly'), ('custom', 'Custom')], default='custom', max_length=16)),
                        ('period_start', models.DateTimeField()),
                        ('period_end', models.DateTimeField()),
                        ('generated_at', models.DateTimeField(auto_now_add=True)),
                        ('data', models.JSONField(default=dict)),
                        ('html', models.TextField(blank=True)),
                        ('csv', models.TextField(blank=True)),
                        ('team', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='reports', to='quotas.team')),
                    ],
                    options={
                        'db_table': 'frontend_report',
                        'ordering': ['-period_end', '-generated_at', '-id'],
                        'indexes': [models.Index(fields=['team', '-period_end'], name='frontend_re_team_id_37f951_idx')],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(relabel_content_type, unrelabel_content_type),
    ]
