"""One configured Kubernetes API client per cluster: endpoint, CA, bearer token or kubeconfig, timeouts, rate limit.

Each cluster gets its own ``ApiClient`` (its own urllib3 connection pool),
its own token bucket and bounded connect/read timeouts, so a slow or dead
cluster costs its own calls at most ``K8S_CONNECT_TIMEOUT_SECONDS`` +
``K8S_READ_TIMEOUT_SECONDS`` and never takes connections or tokens from another.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
import yaml
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException

from ..base import ClusterUnreachable, InvalidCredentials
from ..credentials import CredentialUnreadable


class ApiError(Exception):
    """The API server answered with an error Status: ``status`` (HTTP code), ``reason`` and the server's ``message``."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class RateLimiter:
    """A thread-safe token bucket: ``qps`` tokens per second, at most ``burst`` saved (client-go's flowcontrol)."""

    def __init__(self, qps: float, burst: int):
        self.qps, self.burst = float(qps), max(1, int(burst))
        self._tokens = float(self.burst)
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self, timeout: float) -> None:
        """Take one token, waiting at most ``timeout`` seconds. Raises ClusterUnreachable when none comes in time."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
                self._at = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                wait = (1 - self._tokens) / self.qps
            if time.monotonic() + wait > deadline:
                raise ClusterUnreachable(
                    f"client-side rate limit ({self.qps:g} requests/s) not available in {timeout:g} s"
                )
            time.sleep(wait)


def _server_message(exc: ApiException) -> tuple[str, str]:
    """``(reason, message)`` from the Status object in an ApiException's body (falls back to the HTTP reason)."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    return str(body.get("reason") or exc.reason or ""), str(body.get("message") or exc.reason or "")


#: Seconds a cluster's API group list is trusted (``ClusterClient.serves``) before it is read again: a CRD installed
#: (JobSet's) is used within that long.
DISCOVERY_MAX_AGE_SECONDS = 300.0


class ClusterClient:
    """The API groups of one cluster (``core``, ``batch``, ``apps``, ``version``, ``custom`` for custom resources)
    behind one rate limit and timeouts."""

    def __init__(self, api_client: k8s.ApiClient, limiter: RateLimiter, timeouts: tuple[float, float]):
        self.api_client = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.batch = k8s.BatchV1Api(api_client)
        self.apps = k8s.AppsV1Api(api_client)
        self.version = k8s.VersionApi(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self.limiter = limiter
        self.timeouts = timeouts
        self._timeout = urllib3.Timeout(connect=timeouts[0], read=timeouts[1])
        # Namespaces seen to exist on this cluster (created, or answered 409): dispatch skips their create. A new
        # client (endpoint or credentials changed) starts empty; the runner drops one whose objects answer 404.
        self.namespaces: set[str] = set()
        # The group versions the API server listed (``serves``) and when (``time.monotonic()``); None: not asked yet.
        self.group_versions: tuple[float, frozenset[str]] | None = None

    def serves(self, group_version: str, max_age: float = DISCOVERY_MAX_AGE_SECONDS) -> bool:
        """Whether the API server serves ``group_version`` (e.g. ``jobset.x-k8s.io/v1alpha2``), as a Kueue
        integration finds an optional API: from the API group list (``GET /apis``, an APIGroupList; every group's
        ``versions[].groupVersion``), read again after ``max_age`` seconds. A 404 answer lists none (a server or
        proxy without aggregated discovery). Raises ClusterUnreachable for any other failure or a malformed list."""
        now = time.monotonic()
        if self.group_versions is None or now - self.group_versions[0] >= max_age:
            try:
                body = json.loads(self.call(self._send, "GET", "/apis", None) or b"{}")
            except ApiError as exc:
                if exc.status != 404:
                    raise ClusterUnreachable(f"listing API groups failed: {exc}") from exc
                body = {"groups": []}
            except ValueError as exc:
                raise ClusterUnreachable(f"listing API groups: malformed answer: {exc}") from exc
            groups = body.get("groups") if isinstance(body, dict) else None
            if not isinstance(groups, list):
                raise ClusterUnreachable("listing API groups: the answer is not an APIGroupList")
            self.group_versions = (
                now,
                frozenset(
                    str(v.get("groupVersion"))
                    for g in groups
                    if isinstance(g, dict)
                    for v in g.get("versions") or ()
                    if isinstance(v, dict)
                ),
            )
        return group_version in self.group_versions[1]

    def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """``fn(*args, **kwargs)`` under the rate limit and timeouts.

        Raises ApiError for an HTTP error answer, InvalidCredentials (a
        ClusterUnreachable) for 401 Unauthorized (the cluster refuses the
        stored credential: no call of this cluster can succeed until it is
        re-entered, and a job is never failed for it), ClusterUnreachable when
        the server cannot be reached or does not answer in time.
        """
        self.limiter.acquire(timeout=self.timeouts[1])
        kwargs.setdefault("_request_timeout", self.timeouts)
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status == 0 or exc.status is None:
                raise ClusterUnreachable(str(exc.reason)) from exc
            reason, message = _server_message(exc)
            if int(exc.status) == 401:
                raise InvalidCredentials(
                    f"the cluster refuses the credential (HTTP 401 {reason}: {message}); re-enter it"
                ) from exc
            raise ApiError(int(exc.status), reason, message) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterUnreachable(f"{type(exc).__name__}: {exc}") from exc

    def create(self, path: str, body: dict) -> bytes:
        """POST the manifest ``body`` (a JSON-ready dict) to the collection ``path``
        (e.g. ``/apis/batch/v1/namespaces/cp-ml/jobs``); returns the answer's body.

        The generated ``create_namespaced_*`` methods first validate the dict
        into the client's pydantic model (``V1Job``...) and serialize it back,
        about 0.8 ms of CPU per object, which the API server's own validation
        makes redundant; this sends the dict as JSON through the same
        ``ApiClient`` (its auth, TLS and connection pool). Raises like ``call``.
        """
        return self.call(self._send, "POST", path, body)

    def replace(self, path: str, body: dict) -> bytes:
        """PUT ``body`` (the whole object, a JSON-ready dict) to the object's ``path`` (e.g.
        ``/api/v1/namespaces/cp-ml/configmaps/end-job-1-1``); returns the answer's body. A
        ``metadata.resourceVersion`` in ``body`` makes it a compare-and-set: the API server answers 409 Conflict
        when the object changed since that version was read (Kubernetes API concepts, "Resource versions").
        Raises like ``call``."""
        return self.call(self._send, "PUT", path, body)

    def _send(self, method: str, path: str, body: dict | None, _request_timeout=None) -> bytes:
        """``method`` ``path`` (from the API root) with ``body`` as JSON; returns the answer's body, or raises the
        client's ApiException for a status outside 2xx (``call`` turns it into ApiError).

        Sent straight through the ``ApiClient``'s own urllib3 pool with the headers its ``param_serialize`` gives
        a request (its default headers and cookie, the configuration's credential through
        ``update_params_for_auth``, which calls a kubeconfig's refresh hook as before): ``param_serialize`` and
        ``call_api`` would walk the manifest again (``sanitize_for_serialization``), normalize the headers and
        rebuild the timeouts, about a fifth of the client's CPU per create on the dispatch benchmark, for a dict
        that is JSON already."""
        api = self.api_client
        headers = {"Accept": "application/json", "Content-Type": "application/json", **api.default_headers}
        if api.cookie:
            headers["Cookie"] = api.cookie
        api.update_params_for_auth(headers, None, ["BearerToken"], path, method, body)
        if _request_timeout is None or _request_timeout == self.timeouts:
            timeout = self._timeout
        elif isinstance(_request_timeout, int | float):  # one number: the whole request, as the client reads it
            timeout = urllib3.Timeout(total=_request_timeout)
        else:
            timeout = urllib3.Timeout(connect=_request_timeout[0], read=_request_timeout[1])
        answer = rest.RESTResponse(
            api.rest_client.pool_manager.request(
                method,
                api.configuration.host + path,
                body=None if body is None else json.dumps(body),
                headers=headers,
                timeout=timeout,
                preload_content=False,
            )
        )
        data = answer.read()  # read to the end: the connection goes back to the pool
        if not 200 <= answer.status <= 299:
            raise ApiException.from_response(http_resp=answer, body=None, data=None)
        return data


def _configuration(cluster) -> k8s.Configuration:
    """A client Configuration from the cluster's kubeconfig, or from its endpoint, bearer token and CA bundle."""
    cfg = k8s.Configuration()
    if cluster.kubeconfig:
        k8s_config.load_kube_config_from_dict(
            yaml.safe_load(str(cluster.kubeconfig)), client_configuration=cfg, persist_config=False
        )
    else:
        cfg.host = cluster.api_endpoint.rstrip("/")
        if cluster.api_token:
            cfg.api_key = {"authorization": str(cluster.api_token)}
            cfg.api_key_prefix = {"authorization": "Bearer"}
        if cluster.ca_cert:
            ca = tempfile.NamedTemporaryFile("w", suffix=".crt", prefix="cp-ca-", delete=False)
            with ca:
                ca.write(str(cluster.ca_cert))
            cfg.ssl_ca_cert = ca.name
    cfg.retries = False  # one attempt per call: the callers own retries (dispatch backoff, the next reconcile)
    cfg.connection_pool_maxsize = 8
    return cfg


_CLIENTS: dict[int, tuple[str, ClusterClient]] = {}
_LOCK = threading.Lock()


def _fingerprint(cluster) -> str:
    parts = [
        cluster.api_endpoint,
        str(cluster.api_token),
        str(cluster.ca_cert),
        str(cluster.kubeconfig),
        str(settings.K8S_QPS),
        str(settings.K8S_BURST),
        str(settings.K8S_CONNECT_TIMEOUT_SECONDS),
        str(settings.K8S_READ_TIMEOUT_SECONDS),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def client_for(cluster) -> ClusterClient:
    """The cached client of ``cluster``; rebuilt when its endpoint, credentials or the settings change.

    Raises InvalidCredentials (a ClusterUnreachable: counted against this
    cluster's health alone, with the message as its reason) when a stored
    credential cannot be decrypted (``runners.credentials.CredentialUnreadable``)
    or the client refuses it.
    """
    try:
        fingerprint = _fingerprint(cluster)
    except CredentialUnreadable as exc:  # loaded as UnreadableSecret: this cluster fails, no other
        raise InvalidCredentials(f"credentials of cluster {cluster.name} cannot be used: {exc}") from None
    with _LOCK:
        cached = _CLIENTS.get(cluster.pk)
        if cached is not None and cached[0] == fingerprint:
            return cached[1]
        try:
            configuration = _configuration(cluster)
        except SoftTimeLimitExceeded:  # the task's time is up: not the credentials' fault
            raise
        except Exception as exc:  # YAML, the client's ConfigException, a bad PEM or base64: the credentials' fault
            raise InvalidCredentials(
                f"credentials of cluster {cluster.name} cannot be used: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        api_client = k8s.ApiClient(configuration)
        made = ClusterClient(
            api_client,
            RateLimiter(settings.K8S_QPS, settings.K8S_BURST),
            (float(settings.K8S_CONNECT_TIMEOUT_SECONDS), float(settings.K8S_READ_TIMEOUT_SECONDS)),
        )
        _CLIENTS[cluster.pk] = (fingerprint, made)
        return made
