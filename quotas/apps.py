from django.apps import AppConfig


class QuotasConfig(AppConfig):
    default_auto_field = 'django.db.models.BigAutoField'
    name = 'quotas'

    def ready(self):
        from django.contrib.auth.signals import user_login_failed

        from .signin import count_failed_sign_in

        # Failed sign-ins count against the address and the username (rate limits, docs/adr/0033).
        user_login_failed.connect(count_failed_sign_in, dispatch_uid="quotas.signin.count_failed_sign_in")
