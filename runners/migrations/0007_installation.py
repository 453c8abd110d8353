import uuid

from django.db import migrations, models


def create_installation(apps, schema_editor):
    """The installation's one row, with its id for the labels of every object the platform creates."""
    Installation = apps.get_model("runners", "Installation")
    if not Installation.objects.exists():
        Installation.objects.create(uid=uuid.uuid4())


class Migration(migrations.Migration):

    dependencies = [
        ('runners', '0006_cluster_health_reason'),
    ]

    operations = [
        migrations.CreateModel(
            name='Installation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('uid', models.UUIDField(default=uuid.uuid4, editable=False, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('restored_at', models.DateTimeField(blank=True, null=True)),
                ('recovery_point', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.RunPython(create_installation, migrations.RunPython.noop),
    ]
