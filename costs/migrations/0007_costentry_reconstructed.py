from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('costs', '0006_admin_verbose_names'),
    ]

    operations = [
        migrations.AddField(model_name='costentry', name='reconstructed', field=models.BooleanField(default=False)),
    ]
