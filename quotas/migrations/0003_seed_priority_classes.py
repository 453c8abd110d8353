"""Seed the priority classes that job specs named before the table existed: low 100, normal 500, high 1000."""

from django.db import migrations

DEFAULTS = [("low", 100, "batch work that may wait"), ("normal", 500, "the default"),
            ("high", 1000, "urgent work, admitted first")]


def seed(apps, schema_editor):
    PriorityClass = apps.get_model("quotas", "PriorityClass")
    for name, value, description in DEFAULTS:
        PriorityClass.objects.get_or_create(name=name, defaults={"value": value, "description": description})


def unseed(apps, schema_editor):
    apps.get_model("quotas", "PriorityClass").objects.filter(name__in=[d[0] for d in DEFAULTS]).delete()


class Migration(migrations.Migration):

    dependencies = [("quotas", "0002_fairshare")]

    operations = [migrations.RunPython(seed, unseed)]
