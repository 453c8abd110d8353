import uuid

from django.db import migrations, models


def fill_uids(apps, schema_editor):
    """Every existing attempt gets a uid of its own (its objects keep their old names and labels)."""
    JobAttempt = apps.get_model("jobs", "JobAttempt")
    for attempt in JobAttempt.objects.filter(uid__isnull=True).only("pk").iterator():
        JobAttempt.objects.filter(pk=attempt.pk).update(uid=uuid.uuid4())


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0006_attempt_bad_nodes'),
    ]

    operations = [
        migrations.AddField(model_name='jobattempt', name='uid', field=models.UUIDField(null=True, editable=False)),
        migrations.RunPython(fill_uids, migrations.RunPython.noop),
        migrations.AlterField(model_name='jobattempt', name='uid',
                              field=models.UUIDField(default=uuid.uuid4, editable=False, unique=True)),
        migrations.AddField(model_name='jobattempt', name='adopted_after_restore',
                            field=models.BooleanField(default=False)),
    ]
