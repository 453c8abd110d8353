"""QuotaEvent becomes AuditRecord, the platform's audit trail (ADR 0031): every governed object, with the actor's
name kept as text, the team, the reason, and no cascade from users or teams. On PostgreSQL a trigger refuses
UPDATE and DELETE of its rows."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

REFUSE = """
CREATE OR REPLACE FUNCTION quotas_auditrecord_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = 'audit records are append-only: ' || TG_OP || ' refused',
        ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER quotas_auditrecord_append_only BEFORE UPDATE OR DELETE ON quotas_auditrecord
    FOR EACH ROW EXECUTE FUNCTION quotas_auditrecord_append_only();
"""
ALLOW = """
DROP TRIGGER IF EXISTS quotas_auditrecord_append_only ON quotas_auditrecord;
DROP FUNCTION IF EXISTS quotas_auditrecord_append_only();
"""


def refuse_changes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REFUSE)


def allow_changes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ALLOW)


def fill_names(apps, schema_editor):
    """The actor's username and the team of the records written before: kept as text, they outlive the user."""
    AuditRecord = apps.get_model("quotas", "AuditRecord")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    Quota = apps.get_model("quotas", "Quota")
    names = dict(User.objects.values_list("pk", "username"))
    teams = dict(Quota.objects.values_list("pk", "team_id"))
    for row in AuditRecord.objects.all():
        team = row.object_id if row.object_type == "team" else (
            teams.get(row.object_id) if row.object_type == "quota" else None)
        AuditRecord.objects.filter(pk=row.pk).update(actor_name=names.get(row.actor_id, ""), team_id=team)


def forget_deleted_actors(apps, schema_editor):
    """Backwards: QuotaEvent's actor is a constrained foreign key again, so a deleted user's records lose the link
    (their ``actor_name`` goes with the column)."""
    AuditRecord = apps.get_model("quotas", "AuditRecord")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    AuditRecord.objects.exclude(actor_id__in=User.objects.values("pk")).update(actor_id=None)


class Migration(migrations.Migration):

    dependencies = [
        ('quotas', '0007_change_requests'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RenameModel('QuotaEvent', 'AuditRecord'),
        migrations.RenameField('auditrecord', 'old', 'before'),
        migrations.RenameField('auditrecord', 'new', 'after'),
        migrations.RenameField('auditrecord', 'created_at', 'at'),
        migrations.AlterField(
            model_name='auditrecord',
            name='at',
            field=models.DateTimeField(db_index=True, default=django.utils.timezone.now),
        ),
        migrations.AlterField(
            model_name='auditrecord',
            name='actor',
            field=models.ForeignKey(blank=True, db_constraint=False, null=True,
                                    on_delete=django.db.models.deletion.DO_NOTHING, related_name='+',
                                    to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='auditrecord',
            name='actor_name',
            field=models.CharField(blank=True, help_text="the actor's username; empty: the system", max_length=150),
        ),
        migrations.AddField(
            model_name='auditrecord',
            name='team',
            field=models.ForeignKey(blank=True, db_constraint=False, null=True,
                                    on_delete=django.db.models.deletion.DO_NOTHING, related_name='+',
                                    to='quotas.team'),
        ),
        migrations.AddField(
            model_name='auditrecord',
            name='reason',
            field=models.TextField(blank=True, max_length=2000),
        ),
        migrations.AlterModelOptions(name='auditrecord', options={'ordering': ['-at', '-id']}),
        migrations.AddIndex(
            model_name='auditrecord',
            index=models.Index(fields=['team', 'at'], name='auditrecord_team_at'),
        ),
        migrations.AddIndex(
            model_name='auditrecord',
            index=models.Index(fields=['object_type', 'object_id'], name='auditrecord_object'),
        ),
        migrations.RunPython(fill_names, forget_deleted_actors),
        migrations.RunPython(refuse_changes, allow_changes),
    ]
