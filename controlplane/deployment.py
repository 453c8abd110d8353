"""What a production install must configure, checked when the settings load (docs/adr/0030-secrets.md).

An install is production when ``CONTROLPLANE_ENV=production``: the image sets it (platform/Dockerfile) and so do the
Kubernetes manifests (platform/kubernetes/base/configmap.yaml); a checkout (``make demo``, the tests, a developer's
``manage.py``) leaves it unset and is ``development``. Any other value is refused, so a typo never turns
production into development. In production the settings refuse to load (``ImproperlyConfigured``, naming the
variable and how to make a value) when ``SECRET_KEY`` is missing, the published development default, a template
placeholder or weak (Django's own ``security.W009`` rule: at least 50 characters, 5 distinct ones, no
``django-insecure-`` prefix), when no cluster credential encryption key is configured (production never derives it
from ``SECRET_KEY``), and when ``DEBUG`` is on. A malformed encryption key is refused everywhere.

Functions here take plain values (no Django settings), so tests call them directly.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

PRODUCTION, DEVELOPMENT = "production", "development"
#: The values ``CONTROLPLANE_ENV`` may take.
ENVIRONMENTS = (PRODUCTION, DEVELOPMENT)
#: SECRET_KEY of a checkout that sets none: published in this repository, so accepted outside production only.
DEVELOPMENT_SECRET_KEY = "insecure-dev-key-change-me-in-production"
#: Placeholder marker of platform/kubernetes/base/secret.yaml.
PLACEHOLDER = "REPLACE-ME"
#: Django's security.W009 thresholds (django/core/checks/security/base.py: SECRET_KEY_MIN_LENGTH,
#: SECRET_KEY_MIN_UNIQUE_CHARACTERS, SECRET_KEY_INSECURE_PREFIX).
SECRET_KEY_MIN_LENGTH, SECRET_KEY_MIN_UNIQUE_CHARACTERS = 50, 5
SECRET_KEY_INSECURE_PREFIX = "django-insecure-"

MAKE_SECRET_KEY = "python -c \"import secrets; print(secrets.token_urlsafe(50))\""
MAKE_FERNET_KEY = "python -c \"from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())\""


def environment(value: str) -> str:
    """The deployment environment named by ``CONTROLPLANE_ENV``'s ``value`` ("" means ``development``); raises
    ImproperlyConfigured for anything but ``production`` or ``development``."""
    value = (value or DEVELOPMENT).strip().lower()
    if value not in ENVIRONMENTS:
        raise ImproperlyConfigured(f"CONTROLPLANE_ENV={value!r} is not one of {', '.join(ENVIRONMENTS)}: set "
                                   "CONTROLPLANE_ENV=production on a production install, leave it unset elsewhere.")
    return value


def secret_key(value: str, env: str) -> str:
    """The SECRET_KEY to use given the configured ``value`` ("" when unset) in environment ``env``.

    Outside production an unset value gives ``DEVELOPMENT_SECRET_KEY``. In production raises ImproperlyConfigured
    when ``value`` is empty, the development default, holds the template's ``REPLACE-ME``, starts with
    ``django-insecure-``, is shorter than 50 characters or has fewer than 5 distinct characters (Django's W009).
    """
    if env != PRODUCTION:
        return value or DEVELOPMENT_SECRET_KEY
    how = (f"Set SECRET_KEY (or SECRET_KEY_FILE, a file holding it) to a random value of at least "
           f"{SECRET_KEY_MIN_LENGTH} characters, e.g. {MAKE_SECRET_KEY}.")
    if not value:
        raise ImproperlyConfigured(f"SECRET_KEY is not set and CONTROLPLANE_ENV=production. {how}")
    if value == DEVELOPMENT_SECRET_KEY or PLACEHOLDER in value or value.startswith(SECRET_KEY_INSECURE_PREFIX):
        raise ImproperlyConfigured(f"SECRET_KEY is a published development value or a placeholder and "
                                   f"CONTROLPLANE_ENV=production. {how}")
    if len(value) < SECRET_KEY_MIN_LENGTH or len(set(value)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS:
        raise ImproperlyConfigured(f"SECRET_KEY is too weak for production ({len(value)} characters, "
                                   f"{len(set(value))} distinct). {how}")
    return value


def encryption_keys(keys: list[str], single: str, env: str) -> list[str]:
    """The explicitly configured Fernet keys for the cluster credentials, newest first: ``keys``
    (``FIELD_ENCRYPTION_KEYS``) then ``single`` (``FIELD_ENCRYPTION_KEY``) when set and not listed.

    Raises ImproperlyConfigured when one is not a Fernet key (urlsafe base64 of 32 bytes, as
    ``Fernet.generate_key()`` makes) or the same key is listed twice, anywhere; and in production when there is
    none (it is never derived from SECRET_KEY there). [] outside production means "derive from SECRET_KEY".
    """
    from cryptography.fernet import Fernet

    listed = [k.strip() for k in keys if k and k.strip()]
    if len(set(listed)) != len(listed):
        raise ImproperlyConfigured("FIELD_ENCRYPTION_KEYS lists the same key twice.")
    if single and single.strip() and single.strip() not in listed:
        listed.append(single.strip())
    for position, key in enumerate(listed, start=1):
        try:
            Fernet(key.encode())
        except ValueError:
            raise ImproperlyConfigured(f"Encryption key {position} of FIELD_ENCRYPTION_KEYS / FIELD_ENCRYPTION_KEY "
                                       f"is not a Fernet key (urlsafe base64 of 32 bytes); make one with "
                                       f"{MAKE_FERNET_KEY}.") from None
    if env == PRODUCTION and not listed:
        raise ImproperlyConfigured(f"No key encrypts the clusters' credentials and CONTROLPLANE_ENV=production. "
                                   f"Set FIELD_ENCRYPTION_KEYS (or FIELD_ENCRYPTION_KEYS_FILE) to a key made with "
                                   f"{MAKE_FERNET_KEY}, and back it up: without it the stored credentials cannot "
                                   f"be read.")
    return listed


def refuse_debug(debug: bool, env: str) -> None:
    """Raise ImproperlyConfigured when ``debug`` is on in production (DEBUG pages show settings and source)."""
    if debug and env == PRODUCTION:
        raise ImproperlyConfigured("DEBUG is on and CONTROLPLANE_ENV=production: unset DEBUG (or DEBUG=false).")


#: What single sign-on needs besides OIDC_RP_CLIENT_ID (docs/adr/0032); OIDC_OP_JWKS_ENDPOINT too for the
#: asymmetric algorithms (RS*, ES*, PS*), whose keys the provider publishes there.
OIDC_REQUIRED = ("OIDC_RP_CLIENT_SECRET", "OIDC_OP_ISSUER", "OIDC_OP_AUTHORIZATION_ENDPOINT", "OIDC_OP_TOKEN_ENDPOINT",
                 "OIDC_OP_USER_ENDPOINT")


def refuse_partial_oidc(values: dict[str, str]) -> None:
    """Raise ImproperlyConfigured when ``values`` (setting name -> value, "" when unset) set OIDC_RP_CLIENT_ID but
    leave out any other setting single sign-on needs, naming them and where to read them."""
    if not values.get("OIDC_RP_CLIENT_ID"):
        return
    needed = list(OIDC_REQUIRED)
    if values.get("OIDC_RP_SIGN_ALGO", "")[:2] in ("RS", "ES", "PS"):
        needed.append("OIDC_OP_JWKS_ENDPOINT")
    missing = [name for name in needed if not values.get(name)]
    if missing:
        raise ImproperlyConfigured(f"OIDC_RP_CLIENT_ID is set but {', '.join(missing)} not: single sign-on needs "
                                   "them all (the endpoints and issuer are in the provider's "
                                   "<issuer>/.well-known/openid-configuration).")
