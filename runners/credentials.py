"""Cluster credentials encrypted at rest: a Django text field that stores Fernet tokens, never clear text.

The key is ``settings.FIELD_ENCRYPTION_KEY`` (a Fernet key) or, when that is
empty, derived from ``SECRET_KEY`` with HKDF-SHA256 (RFC 5869).
"""

from __future__ import annotations

import base64
import functools

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import models

PREFIX = "fernet:"


@functools.lru_cache(maxsize=4)
def _fernet(explicit_key: str, secret_key: str) -> Fernet:
    if explicit_key:
        return Fernet(explicit_key.encode())
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                   info=b"controlplane cluster credentials").derive(secret_key.encode())
    return Fernet(base64.urlsafe_b64encode(derived))


def fernet() -> Fernet:
    """The Fernet instance for the current settings (cached per key)."""
    return _fernet(settings.FIELD_ENCRYPTION_KEY, settings.SECRET_KEY)


def encrypt(text: str) -> str:
    """``fernet:<token>`` for a non-empty ``text``; "" stays "" (no credential)."""
    if not text:
        return ""
    return PREFIX + fernet().encrypt(text.encode()).decode()


def decrypt(stored: str) -> str:
    """The clear text of a stored ``fernet:<token>``. Raises ValueError when the key does not match."""
    if not stored:
        return ""
    if not stored.startswith(PREFIX):
        raise ValueError("credential is not encrypted (no fernet: prefix)")
    try:
        return fernet().decrypt(stored[len(PREFIX):].encode()).decode()
    except InvalidToken as exc:
        raise ValueError("credential cannot be decrypted with the configured key") from exc


class Secret(str):
    """A decrypted credential: a str whose repr never shows the value (so it never lands in a log by accident)."""

    def __repr__(self) -> str:
        return "Secret('***')" if self else "Secret('')"


class EncryptedTextField(models.TextField):
    """A TextField whose database value is a Fernet token; Python code sees a ``Secret`` (clear text)."""

    def from_db_value(self, value, expression, connection):
        if value is None:
            return value
        return Secret(decrypt(value))

    def to_python(self, value):
        if value is None or isinstance(value, Secret):
            return value
        if isinstance(value, str) and value.startswith(PREFIX):
            return Secret(decrypt(value))
        return Secret(value)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        if value is None:
            return value
        return encrypt(str(value))
