"""Settings of the test OpenID Connect provider; ``OIDC_PROVIDER_DATA`` is its directory (database, signing key)."""

import os
from pathlib import Path

DATA = Path(os.environ["OIDC_PROVIDER_DATA"])

SECRET_KEY = "test-provider-key-not-a-secret-of-anything-0123456789"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
    "tests.support.oidc_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "tests.support.oidc_provider.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(DATA / "provider.sqlite3"),
        "OPTIONS": {"timeout": 30},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; nothing here is a real secret
LOGIN_URL = "/accounts/login/"
# Browsers share cookies between ports of one host: names of its own, so the control plane's stay untouched.
SESSION_COOKIE_NAME = "provider_signed_in"
CSRF_COOKIE_NAME = "provider_csrftoken"

OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": (DATA / "signing-key.pem").read_text() if (DATA / "signing-key.pem").exists() else "",
    "SCOPES": {"openid": "OpenID Connect", "email": "Email address", "profile": "Name"},
    "OAUTH2_VALIDATOR_CLASS": "tests.support.oidc_provider.validator.GroupsValidator",
    "PKCE_REQUIRED": True,
}
