"""The Report model belongs to costs now (``costs.0003_report``); its table stays, so this removes it from state only."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('costs', '0003_report'),
        ('frontend', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='Report')],
            database_operations=[],
        ),
    ]
