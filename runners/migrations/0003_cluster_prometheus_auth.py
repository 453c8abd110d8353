"""Basic-auth credentials of a cluster's Prometheus move out of ``prometheus_url`` into the encrypted
``prometheus_auth``; user info in ``api_endpoint`` (which Kubernetes never used) is dropped."""

from django.db import migrations

import runners.credentials


def split_credentials_out_of_urls(apps, schema_editor):
    Cluster = apps.get_model("runners", "Cluster")
    for cluster in Cluster.objects.filter(prometheus_url__contains="@") | Cluster.objects.filter(
            api_endpoint__contains="@"):
        cluster.prometheus_url, auth = runners.credentials.split_userinfo(cluster.prometheus_url)
        if auth:
            cluster.prometheus_auth = auth
        cluster.api_endpoint = runners.credentials.without_userinfo(cluster.api_endpoint)
        cluster.save(update_fields=["prometheus_url", "prometheus_auth", "api_endpoint"])


class Migration(migrations.Migration):

    dependencies = [
        ("runners", "0002_cluster_credentials"),
    ]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="prometheus_auth",
            field=runners.credentials.EncryptedTextField(
                blank=True, default="", help_text="Prometheus basic auth user:password (encrypted at rest)"),
        ),
        migrations.RunPython(split_credentials_out_of_urls, migrations.RunPython.noop),
    ]
