"""Cluster credentials encrypted at rest: a Django text field that stores Fernet tokens, never clear text.

The keys (newest first) are ``settings.FIELD_ENCRYPTION_KEYS`` followed by ``settings.FIELD_ENCRYPTION_KEY`` (the
single key of earlier installs, when set and not already listed): new values are encrypted with the first, and a
stored value is read with whichever of them made it (``cryptography.fernet.MultiFernet``), so a key is rotated by
putting a new one first, running ``manage.py rotate_credentials`` (``rotate_stored``) and then dropping the old one.
Where neither is set (the demo and the tests only: production settings refuse to start without one,
``controlplane.deployment``) the one key is derived from ``SECRET_KEY`` with HKDF-SHA256 (RFC 5869).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
from urllib.parse import urlsplit, urlunsplit

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import models

PREFIX = "fernet:"


def derived_key(secret_key: str) -> bytes:
    """The Fernet key derived from ``secret_key`` (HKDF-SHA256, RFC 5869, no salt, info "controlplane cluster
    credentials"): the demo's key when no encryption key is configured. Never used in production."""
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                   info=b"controlplane cluster credentials").derive(secret_key.encode())
    return base64.urlsafe_b64encode(derived)


def configured_keys() -> tuple[str, ...]:
    """The explicitly configured Fernet keys, newest first: ``settings.FIELD_ENCRYPTION_KEYS`` (the settings put
    ``FIELD_ENCRYPTION_KEY`` at its end already; it is added here too when a test overrides it alone). () when
    none is configured (then the key is derived from SECRET_KEY)."""
    keys = list(settings.FIELD_ENCRYPTION_KEYS)
    single = getattr(settings, "FIELD_ENCRYPTION_KEY", "")
    if single and single not in keys:
        keys.append(single)
    return tuple(keys)


@functools.lru_cache(maxsize=8)
def _keyring(keys: tuple[str, ...], secret_key: str) -> tuple[Fernet, ...]:
    if keys:
        return tuple(Fernet(key.encode()) for key in keys)
    return (Fernet(derived_key(secret_key)),)


def keyring() -> tuple[Fernet, ...]:
    """One ``Fernet`` per key of the current settings, newest first (cached per configuration); raises ValueError
    for a key that is not urlsafe base64 of 32 bytes."""
    return _keyring(configured_keys(), settings.SECRET_KEY)


def fernet() -> MultiFernet:
    """The ``MultiFernet`` of the current keys: encrypts with the newest, decrypts with any of them."""
    return MultiFernet(list(keyring()))


def encrypt(text: str) -> str:
    """``fernet:<token>`` for a non-empty ``text`` (with the newest key); "" stays "" (no credential)."""
    if not text:
        return ""
    return PREFIX + fernet().encrypt(text.encode()).decode()


class CredentialUnreadable(ValueError):
    """A stored credential that cannot be read: its ciphertext does not decrypt with any configured key (the key
    changed, or the row was written with another one), or it is not encrypted at all. Raised only where the
    clear text is needed (building a cluster's Kubernetes client, a Prometheus URL with its basic auth); loading
    the row never raises it (``EncryptedTextField.from_db_value`` gives an ``UnreadableSecret``)."""


#: What a user reads when a credential cannot be decrypted, and what to do about it.
UNREADABLE_REASON = "credential cannot be decrypted with the configured key; re-enter it"


def decrypt(stored: str) -> str:
    """The clear text of a stored ``fernet:<token>`` ("" for ""). Raises CredentialUnreadable (a ValueError) when the
    value has no ``fernet:`` prefix or no configured key decrypts it."""
    if not stored:
        return ""
    if not stored.startswith(PREFIX):
        raise CredentialUnreadable("credential is not encrypted (no fernet: prefix); re-enter it")
    try:
        return fernet().decrypt(stored[len(PREFIX):].encode()).decode()
    except InvalidToken as exc:
        raise CredentialUnreadable(UNREADABLE_REASON) from exc


class Secret(str):
    """A decrypted credential: a str whose repr never shows the value (so it never lands in a log by accident)."""

    def __repr__(self) -> str:
        return "Secret('***')" if self else "Secret('')"


class UnreadableSecret:
    """The value of a credential column that cannot be decrypted (``CredentialUnreadable``).

    Class of failure: one cluster's fault stops every cluster. A row whose
    secret cannot be read would make every query that loads it raise (every
    reconcile pass, every list of clusters or jobs). Invariant: loading a row
    never raises because of its secret. This marker takes the clear text's
    place; it is truthy (a credential is configured), ``str()`` of it raises
    CredentialUnreadable (so the one place that needs the clear text, the
    cluster's client, fails for that cluster alone, with the reason), and
    saving the row writes ``stored`` back unchanged (the ciphertext is kept:
    with the right key configured again it reads again). ``repr`` never shows
    the ciphertext.
    """

    __slots__ = ("stored", "reason")

    def __init__(self, stored: str, reason: str = UNREADABLE_REASON):
        self.stored, self.reason = stored, reason

    def __str__(self) -> str:
        raise CredentialUnreadable(self.reason)

    def __bool__(self) -> bool:
        return True

    def __eq__(self, other) -> bool:
        return isinstance(other, UnreadableSecret) and other.stored == self.stored

    def __hash__(self) -> int:
        return hash(("UnreadableSecret", self.stored))

    def __repr__(self) -> str:
        return "UnreadableSecret('***')"


def read_stored(value: str) -> Secret | UnreadableSecret:
    """The Python value of a stored credential ``value``: its clear text as a ``Secret``, or an ``UnreadableSecret``
    when it cannot be decrypted (never raises)."""
    try:
        return Secret(decrypt(value))
    except CredentialUnreadable as exc:
        return UnreadableSecret(value, str(exc))


class EncryptedTextField(models.TextField):
    """A TextField whose database value is a Fernet token; Python code sees a ``Secret`` (clear text), or an
    ``UnreadableSecret`` when no configured key decrypts it (loading a row never raises)."""

    def from_db_value(self, value, expression, connection):
        if value is None:
            return value
        return read_stored(value)

    def to_python(self, value):
        if value is None or isinstance(value, (Secret, UnreadableSecret)):
            return value
        if isinstance(value, str) and value.startswith(PREFIX):
            return read_stored(value)
        return Secret(value)

    def get_prep_value(self, value):
        if isinstance(value, UnreadableSecret):
            return value.stored  # kept as stored: re-entering the credential replaces it
        value = super().get_prep_value(value)
        if value is None:
            return value
        return encrypt(str(value))

    def value_to_string(self, obj) -> str:
        """The stored form for serialization (``dumpdata``): an unreadable value stays its ciphertext."""
        value = self.value_from_object(obj)
        return value.stored if isinstance(value, UnreadableSecret) else super().value_to_string(obj)


# --- rotation to the newest key ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class Rotation:
    """What ``rotate_stored`` did, in stored credential values (one column of one row each): ``rotated`` were
    re-encrypted with the newest key, ``current`` already were, ``empty`` hold no credential, ``changed`` were
    written by someone else meanwhile (left to that write), and ``unreadable`` lists ``(row, field, reason)`` of
    every value no configured key reads (``row`` names it: ``cluster aws-use1``): left as stored."""

    rotated: int = 0
    current: int = 0
    empty: int = 0
    changed: int = 0
    unreadable: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)


def encrypted_columns() -> list[tuple[type[models.Model], list[str]]]:
    """Every installed model with ``EncryptedTextField`` columns, with the names of those fields."""
    from django.apps import apps

    found = []
    for model in apps.get_models():
        names = [f.name for f in model._meta.concrete_fields if isinstance(f, EncryptedTextField)]
        if names:
            found.append((model, names))
    return found


def rotate_stored(batch: int = 200) -> Rotation:
    """Re-encrypt every stored credential with the newest configured key (``MultiFernet.rotate``); idempotent.

    Reads the stored tokens themselves (SQL, ``batch`` rows at a time in primary key order) and writes each
    rotated one back with a compare-and-set (``UPDATE ... WHERE pk = %s AND <column> = <the token read>``), so a
    credential re-entered meanwhile is never overwritten. A value the newest key already reads is left as it is
    (a second run writes nothing); one that no configured key reads, or that is not encrypted, is counted in
    ``unreadable`` with its row, field and reason and never changed, so configuring its key again still reads it.
    Returns a ``Rotation``.
    """
    from django.db import connection, transaction

    ring = keyring()
    newest, rotator = ring[0], MultiFernet(list(ring))
    report = Rotation()
    quote = connection.ops.quote_name
    for model, names in encrypted_columns():
        table, key = quote(model._meta.db_table), quote(model._meta.pk.column)
        columns = [model._meta.get_field(n).column for n in names]
        last = None
        while True:
            after = f"WHERE {key} > %s " if last is not None else ""
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT {key}, {', '.join(quote(c) for c in columns)} FROM {table} {after}"
                               f"ORDER BY {key} LIMIT {int(batch)}", [last] if last is not None else [])
                rows = cursor.fetchall()
            if not rows:
                break
            last = rows[-1][0]
            labels = {obj.pk: f"{model._meta.verbose_name} {obj}"
                      for obj in model._default_manager.filter(pk__in=[r[0] for r in rows])}
            for row in rows:
                for name, column, stored in zip(names, columns, row[1:], strict=True):
                    if not stored:
                        report.empty += 1
                        continue
                    outcome = _rotated(stored, newest, rotator)
                    if isinstance(outcome, CredentialUnreadable):
                        where = labels.get(row[0], f"{model._meta.verbose_name} #{row[0]}")
                        report.unreadable.append((where, name, str(outcome)))
                    elif outcome == stored:
                        report.current += 1
                    else:
                        with transaction.atomic(), connection.cursor() as cursor:
                            cursor.execute(f"UPDATE {table} SET {quote(column)} = %s WHERE {key} = %s "
                                           f"AND {quote(column)} = %s", [outcome, row[0], stored])
                            written = cursor.rowcount == 1
                        report.rotated += written
                        report.changed += not written
    return report


def _rotated(stored: str, newest: Fernet, rotator: MultiFernet) -> str | CredentialUnreadable:
    """The non-empty stored value ``stored`` as the newest key would store it: ``stored`` itself when the newest key
    already reads it, a new ``fernet:`` token when an older key does, and a CredentialUnreadable (returned, not
    raised) when no key reads it or it is not encrypted."""
    if not stored.startswith(PREFIX):
        return CredentialUnreadable("credential is not encrypted (no fernet: prefix); re-enter it")
    token = stored[len(PREFIX):].encode()
    try:
        newest.decrypt(token)
        return stored
    except InvalidToken:
        pass
    try:
        return PREFIX + rotator.rotate(token).decode()
    except InvalidToken:
        return CredentialUnreadable(UNREADABLE_REASON)

# --- credentials inside URLs and kubeconfigs, checked on input ------------------------------------------------------

def split_userinfo(url: str) -> tuple[str, str]:
    """``(url without user info, "user:password" or "")`` of ``url``: ``https://u:p@host:9090/x`` gives
    ``("https://host:9090/x", "u:p")``. User and password stay percent-encoded as written (RFC 3986 3.2.1)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, ""
    userinfo, _, hostport = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=hostport)), userinfo


def without_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` removed (what answers and logs may show)."""
    return split_userinfo(url)[0]


def with_userinfo(url: str, userinfo: str) -> str:
    """``url`` with ``userinfo`` (``user:password``, as ``split_userinfo`` gives it) put back; ``url`` if empty."""
    if not userinfo:
        return url
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc}"))


#: Largest accepted kubeconfig, bytes (a kubeconfig with embedded certificates is a few KiB).
KUBECONFIG_MAX_BYTES = 64 * 1024
#: kubeconfig user fields that make the control plane read a file or run a command on its own machine:
#: refused (embed the data instead: token, client-certificate-data, client-key-data).
KUBECONFIG_REFUSED_USER_FIELDS = ("exec", "auth-provider", "tokenFile", "client-certificate", "client-key",
                                  "username", "password")


class InvalidKubeconfig(ValueError):
    """A kubeconfig that the control plane cannot use; the message says why."""


def validate_kubeconfig(text: str) -> dict:
    """The parsed kubeconfig ``text`` (a YAML mapping) if the Kubernetes client can build a configuration from
    its current context with embedded credentials only; raises InvalidKubeconfig with the reason otherwise.

    Checks (the kubeconfig format of kubernetes.io/docs/concepts/configuration/organize-cluster-access-kubeconfig):
    YAML of at most ``KUBECONFIG_MAX_BYTES``; ``current-context`` names an entry of ``contexts`` whose
    ``cluster`` and ``user`` name entries of ``clusters`` and ``users``; the cluster has an http(s) ``server``
    without user info and no ``certificate-authority`` file; the user has none of
    ``KUBECONFIG_REFUSED_USER_FIELDS``; then ``kubernetes.config.load_kube_config_from_dict`` must accept it.
    """
    import yaml
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    if len(text.encode()) > KUBECONFIG_MAX_BYTES:
        raise InvalidKubeconfig(f"longer than {KUBECONFIG_MAX_BYTES} bytes")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidKubeconfig(f"not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise InvalidKubeconfig("not a kubeconfig: a YAML mapping with clusters, contexts, users is expected")

    def entry(kind: str, name) -> dict:
        items = doc.get(kind)
        if not isinstance(items, list):
            raise InvalidKubeconfig(f"'{kind}' must be a list")
        for item in items:
            if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(kind[:-1]), dict):
                return item[kind[:-1]]
        raise InvalidKubeconfig(f"no entry named {name!r} under '{kind}'")

    current = doc.get("current-context")
    if not current or not isinstance(current, str):
        raise InvalidKubeconfig("'current-context' is missing")
    context = entry("contexts", current)
    cluster = entry("clusters", context.get("cluster"))
    user = entry("users", context.get("user"))
    server = cluster.get("server")
    if not isinstance(server, str) or urlsplit(server).scheme not in ("http", "https") or not urlsplit(server).hostname:
        raise InvalidKubeconfig(f"cluster {context.get('cluster')!r}: 'server' must be an http(s) URL")
    if split_userinfo(server)[1]:
        raise InvalidKubeconfig(f"cluster {context.get('cluster')!r}: 'server' must not carry user:password@")
    if "certificate-authority" in cluster:
        raise InvalidKubeconfig(f"cluster {context.get('cluster')!r}: 'certificate-authority' names a file; "
                                "embed it as 'certificate-authority-data'")
    refused = [f for f in KUBECONFIG_REFUSED_USER_FIELDS if f in user]
    if refused:
        raise InvalidKubeconfig(f"user {context.get('user')!r}: {', '.join(refused)} not accepted (the control "
                                "plane runs no command and reads no file of a kubeconfig); embed a token or "
                                "client-certificate-data and client-key-data")
    _check_pem(cluster, "certificate-authority-data", f"cluster {context.get('cluster')!r}")
    _check_pem(user, "client-certificate-data", f"user {context.get('user')!r}")
    _check_pem(user, "client-key-data", f"user {context.get('user')!r}")
    try:
        k8s_config.load_kube_config_from_dict(doc, client_configuration=k8s.Configuration(), persist_config=False)
    except Exception as exc:  # the client's ConfigException, or a bad base64 / PEM inside it
        raise InvalidKubeconfig(f"the Kubernetes client refuses it: {exc}") from None
    return doc


def _check_pem(section: dict, field: str, where: str) -> None:
    """Raise InvalidKubeconfig unless ``section[field]`` (when present) is base64 of PEM certificates (the ``*-data``
    certificate fields) or of a PEM private key (``client-key-data``)."""
    if field not in section:
        return
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        pem = base64.b64decode(str(section[field]), validate=True)
        if field == "client-key-data":
            load_pem_private_key(pem, password=None)
        else:
            x509.load_pem_x509_certificates(pem)
    except Exception:  # binascii.Error, ValueError, TypeError, UnsupportedAlgorithm
        kind = "private key" if field == "client-key-data" else "certificate"
        raise InvalidKubeconfig(f"{where}: '{field}' is not a base64-encoded PEM {kind}") from None
