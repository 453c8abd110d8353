"""The ledger bills GPUs in milli-GPUs (ADR 0040: a share of one GPU is billed as its share): ``CostEntry.gpus``
(whole GPUs) becomes ``gpu_milli`` (each existing row's GPUs x 1000), and the totals' GPU-seconds keep 9 decimals
(milli-GPUs x microseconds are exact there)."""

from django.db import migrations, models

TOTALS = ("dailycostrollup", "jobdailycost", "attemptdailycost")


class Migration(migrations.Migration):

    dependencies = [
        ("costs", "0015_node_utilization_role"),
    ]

    operations = [
        migrations.RenameField(model_name="costentry", old_name="gpus", new_name="gpu_milli"),
        migrations.AlterField(
            model_name="costentry", name="gpu_milli",
            field=models.PositiveBigIntegerField(help_text="GPUs billed, milli-GPU (1000 = one GPU; 250 = a quarter)"),
        ),
        migrations.RunSQL("UPDATE costs_costentry SET gpu_milli = gpu_milli * 1000",
                          "UPDATE costs_costentry SET gpu_milli = gpu_milli / 1000"),
        *[migrations.AlterField(model_name=m, name=f, field=models.DecimalField(
            decimal_places=9, max_digits=27, **({"default": 0} if f == "unpriced_gpu_seconds" else {})))
          for m in TOTALS for f in ("gpu_seconds", "unpriced_gpu_seconds")],
        *[migrations.AlterField(model_name="teamspend", name=f,
                                field=models.DecimalField(decimal_places=9, default=0, max_digits=31))
          for f in ("gpu_seconds", "unpriced_gpu_seconds")],
    ]
