from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('costs', '0007_cpu_prices'),
    ]

    operations = [
        migrations.AddField(model_name='costentry', name='reconstructed', field=models.BooleanField(db_default=False, default=False)),
    ]
