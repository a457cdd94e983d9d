"""Django settings for Lab.

Every value comes from the environment through the typed helpers in ``lab.config`` (every variable
is listed in docs/configuration.md). With no environment at all, Lab runs on embedded defaults: SQLite under
``LAB_DATA_DIR``, a Celery broker on SQLite (no server), the local launcher and file storage.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sys
from decimal import Decimal
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from lab.config import (
    env_bool,
    env_choice,
    env_decimal,
    env_int,
    env_int_list,
    env_json,
    env_list,
    env_raw,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# --- where Lab keeps its files --------------------------------------------------------------
LAB_DATA_DIR = Path(env_str("LAB_DATA_DIR", str(BASE_DIR / "var"))).resolve()
LAB_DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
LAB_MODEL_DIR = Path(env_str("LAB_MODEL_DIR", str(LAB_DATA_DIR / "models"))).resolve()

# --- core Django -----------------------------------------------------------------------------
DEBUG = env_bool("DEBUG", True)


def _secret_key() -> str:
    """Return SECRET_KEY; in DEBUG without one, a random key kept under LAB_DATA_DIR."""
    key = env_str("SECRET_KEY")
    if key:
        if not DEBUG and (len(key) < 50 or len(set(key)) < 5 or key.startswith("django-insecure")):
            raise ImproperlyConfigured("SECRET_KEY is too weak for DEBUG=0: use at least 50 random characters")
        return key
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) must be set when DEBUG=0")
    key_file = LAB_DATA_DIR / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(64))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
if not DEBUG and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when DEBUG=0")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "csp",
    "lab",
    "jobs",
    "billing",
    "environments",
    "sandboxes",
    "serving",
    "evaluations",
    "dashboard",
]

MIDDLEWARE = [
    "lab.middleware.RequestIdMiddleware",
    "lab.middleware.PrometheusMiddleware",
    "lab.middleware.BodySizeLimitMiddleware",
    "lab.middleware.NulCharacterMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "lab.middleware.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "lab.urls"
WSGI_APPLICATION = "lab.wsgi.application"
ASGI_APPLICATION = "lab.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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

# --- database --------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0, minimum=0))}
else:
    # Web, worker and engine reporting share the file: WAL lets readers run beside one writer,
    # IMMEDIATE transactions take the write lock up front, and the timeout waits for it.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": LAB_DATA_DIR / "lab.sqlite3",
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;",
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis, cache, Celery --------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            # A Redis that hangs must not hang requests: rate limits fail open after this.
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(LAB_DATA_DIR / "cache"),
        }
    }

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL") or REDIS_URL or f"sqla+sqlite:///{LAB_DATA_DIR / 'celery-broker.sqlite3'}"
# The longest task is bounded by CELERY_TASK_TIME_LIMIT; the broker must not redeliver a task
# that is still running, so its visibility timeout stays well above that limit.
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 300, minimum=1)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 240, minimum=1)
# (Redis and SQS honour it; the embedded SQLAlchemy transport takes engine options instead.)
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {"visibility_timeout": CELERY_TASK_TIME_LIMIT * 4} if not CELERY_BROKER_URL.startswith("sqla+") else {}
)
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

# --- Lab -------------------------------------------------------------------------------------
LAB_PUBLIC_URL = env_str("LAB_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
# serving's lookup of a deployment a job spec names (jobs/deployments.py; serving sits above jobs)
LAB_DEPLOYMENT_ENDPOINT = "serving.selectors.deployment_endpoint"
LAB_LAUNCHER = env_choice("LAB_LAUNCHER", "local", ("local", "kubernetes"))
LAB_LOCAL_SLOTS = env_int("LAB_LOCAL_SLOTS", 1, minimum=1, maximum=64)
# Each local engine attempt in a bubblewrap sandbox (docs/local-launcher.md "Isolation"); "none"
# lets environment code see what Lab's own user sees: only for machines where all code is trusted.
LAB_LOCAL_ISOLATION = env_choice("LAB_LOCAL_ISOLATION", "bubblewrap", ("bubblewrap", "none"))
# A sandboxed local engine reaches its job's own outside endpoints ([teacher]) through a relay;
# loopback and private addresses are refused unless this is on (local development, tests).
LAB_ENGINE_EGRESS_ALLOW_PRIVATE = env_bool("LAB_ENGINE_EGRESS_ALLOW_PRIVATE", False)
LAB_WEBHOOK_ALLOW_PRIVATE = env_bool("LAB_WEBHOOK_ALLOW_PRIVATE", False)
LAB_STORAGE_URL = env_str("LAB_STORAGE_URL", "")
# Where environment builds resolve and fetch packages (a PEP 503 index: PyPI, a company mirror, or a folder's file:// URL).
LAB_PACKAGE_INDEX_URL = env_str("LAB_PACKAGE_INDEX_URL", "https://pypi.org/simple")
# The longest one environment build may take, in seconds (resolve, fetch, install, load); past it the build fails.
LAB_ENVIRONMENT_BUILD_TIMEOUT_S = env_int("LAB_ENVIRONMENT_BUILD_TIMEOUT_S", 1800, minimum=60)
# Models (docs/models.md): the Hugging Face endpoint `manage.py models add` downloads from and the
# token it sends (HF_TOKEN_FILE works; none by default); the largest model archive an organization
# may push, and the most bytes one may unpack to; the longest one model check may take, in seconds.
LAB_HF_ENDPOINT = env_str("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
LAB_HF_TOKEN = env_str("HF_TOKEN", "")
LAB_MODEL_MAX_BYTES = env_int("LAB_MODEL_MAX_BYTES", 20 * 1024**3, minimum=1024**2)
LAB_MODEL_CHECK_TIMEOUT_S = env_int("LAB_MODEL_CHECK_TIMEOUT_S", 1800, minimum=30)
if LAB_STORAGE_URL and not LAB_STORAGE_URL.startswith("s3://"):
    raise ImproperlyConfigured("LAB_STORAGE_URL must be empty (filesystem) or s3://bucket/prefix")
LAB_POOL = env_json("LAB_POOL", {"nodes": [{"gpu_type": "cpu", "gpus": 0, "count": 1}]})
# Without LAB_POOL the Kubernetes pool's inventory is read from the cluster's nodes (jobs/pool.py).
LAB_POOL_CONFIGURED = env_raw("LAB_POOL") is not None
if not isinstance(LAB_POOL, dict) or not isinstance(LAB_POOL.get("nodes"), list):
    raise ImproperlyConfigured('LAB_POOL must be a JSON object like {"nodes": [{"gpu_type": "H100", "gpus": 8, "count": 2}]}')
LAB_ENGINE_IMAGE = env_str("LAB_ENGINE_IMAGE", "lab-engine:latest")
LAB_ORG_MAX_RUNNING_JOBS = env_int("LAB_ORG_MAX_RUNNING_JOBS", 4, minimum=1)
# Sandboxes (docs/sandboxes.md): concurrent ones per organization, processes and open files per
# command; "egress" sandboxes share the host's network, so they are off unless this is on.
LAB_SANDBOX_MAX_PER_ORG = env_int("LAB_SANDBOX_MAX_PER_ORG", 20, minimum=1)
LAB_SANDBOX_MAX_PROCESSES = env_int("LAB_SANDBOX_MAX_PROCESSES", 256, minimum=8)
LAB_SANDBOX_MAX_OPEN_FILES = env_int("LAB_SANDBOX_MAX_OPEN_FILES", 1024, minimum=16)
LAB_SANDBOX_ALLOW_EGRESS = env_bool("LAB_SANDBOX_ALLOW_EGRESS", False)
# Days an ended sandbox's log is kept in storage (docs/sandboxes.md "Logs").
LAB_SANDBOX_LOG_RETENTION_DAYS = env_int("LAB_SANDBOX_LOG_RETENTION_DAYS", 30, minimum=1, maximum=3650)
# The sandbox agent that holds sandboxes (docs/sandboxes.md "Data plane"): where the control plane reaches it,
# the address clients are given for its data plane, the secret Lab and the agent sign tokens with (derived
# from SECRET_KEY unless set; NAME_FILE works) and a data-plane token's lifetime in seconds.
LAB_SANDBOX_AGENT_URL = env_str("LAB_SANDBOX_AGENT_URL", "http://127.0.0.1:8765").rstrip("/")
LAB_SANDBOX_DATA_PLANE_URL = env_str("LAB_SANDBOX_DATA_PLANE_URL", LAB_SANDBOX_AGENT_URL).rstrip("/")
_DERIVED_AGENT_SECRET = hmac.new(SECRET_KEY.encode(), b"lab sandbox agent", hashlib.sha256).hexdigest()
LAB_SANDBOX_AGENT_SECRET = env_str("LAB_SANDBOX_AGENT_SECRET") or _DERIVED_AGENT_SECRET
if len(LAB_SANDBOX_AGENT_SECRET) < 32:
    raise ImproperlyConfigured("LAB_SANDBOX_AGENT_SECRET must hold at least 32 characters")
LAB_SANDBOX_TOKEN_TTL_S = env_int("LAB_SANDBOX_TOKEN_TTL_S", 900, minimum=60, maximum=86_400)
# Sandboxes without a network the agent keeps started ahead, so that a create claims one at once.
LAB_SANDBOX_WARM = env_int("LAB_SANDBOX_WARM", 4, minimum=0, maximum=256)
# Keys besides API keys that Prime's sandbox routes take, within bounds (sandboxes.grants): a job attempt's.
LAB_SANDBOX_GRANT_AUTHENTICATION = ["jobs.ingest.views.JobSandboxKeyAuthentication"]
# Deployments (docs/serving.md): active ones per organization; adapters one inference server keeps
# loaded; seconds a server may sit idle before it is scaled to zero; how long a request waits for a
# server to start, how long a server may take to start, how long one request may take (seconds);
# requests per minute one API key may make to the OpenAI-compatible API.
LAB_SERVING_MAX_DEPLOYMENTS_PER_ORG = env_int("LAB_SERVING_MAX_DEPLOYMENTS_PER_ORG", 20, minimum=1)
LAB_SERVING_MAX_ADAPTERS = env_int("LAB_SERVING_MAX_ADAPTERS", 8, minimum=1, maximum=256)
LAB_SERVING_IDLE_S = env_int("LAB_SERVING_IDLE_S", 900, minimum=1)
LAB_SERVING_WAKE_TIMEOUT_S = env_int("LAB_SERVING_WAKE_TIMEOUT_S", 300, minimum=1)
LAB_SERVING_START_TIMEOUT_S = env_int("LAB_SERVING_START_TIMEOUT_S", 900, minimum=10)
LAB_SERVING_REQUEST_TIMEOUT_S = env_int("LAB_SERVING_REQUEST_TIMEOUT_S", 600, minimum=1)
LAB_INFERENCE_RATE_LIMIT_PER_MINUTE = env_int("LAB_INFERENCE_RATE_LIMIT_PER_MINUTE", 600, minimum=1)
# What inference servers sample with: transformers, or vLLM with LoRA (the highest adapter rank it takes).
LAB_SERVING_BACKEND = env_choice("LAB_SERVING_BACKEND", "transformers", ("transformers", "vllm"))
LAB_SERVING_MAX_LORA_RANK = env_int("LAB_SERVING_MAX_LORA_RANK", 64, minimum=1, maximum=512)
# Where inference servers run: local processes, or Deployments on the Kubernetes pool (default: as
# LAB_LAUNCHER); there, their namespace, the GPU type they run on, and the ReadWriteMany claim of
# the deployments' unpacked weights, mounted by the worker at LAB_DATA_DIR/serving/weights.
LAB_SERVING_RUNTIME = env_choice("LAB_SERVING_RUNTIME", LAB_LAUNCHER, ("local", "kubernetes"))
LAB_K8S_SERVING_NAMESPACE = env_str("LAB_K8S_SERVING_NAMESPACE", "lab-serving")
LAB_SERVING_GPU_TYPE = env_str("LAB_SERVING_GPU_TYPE", "H100")
LAB_K8S_SERVING_WEIGHTS_PVC = env_str("LAB_K8S_SERVING_WEIGHTS_PVC", "")
LAB_HEARTBEAT_TIMEOUT_S = env_int("LAB_HEARTBEAT_TIMEOUT_S", 120, minimum=1)
# After Lab asks an engine to stop (its status answer), it waits this long before SIGTERM, then again before SIGKILL.
LAB_STOP_GRACE_S = env_int("LAB_STOP_GRACE_S", 30, minimum=0)
LAB_KILL_GRACE_S = env_int("LAB_KILL_GRACE_S", 30, minimum=0)
LAB_RECONCILE_INTERVAL_S = env_int("LAB_RECONCILE_INTERVAL_S", 5, minimum=1)
# Requests per minute one job's engine may make to the ingest API before it gets 429.
LAB_INGEST_RATE_LIMIT_PER_MINUTE = env_int("LAB_INGEST_RATE_LIMIT_PER_MINUTE", 1200, minimum=1)
# Live stream: a comment line this often keeps proxies from closing an idle stream
# (docs/live-stream.md); without Redis, clients poll the database this often (milliseconds).
LAB_STREAM_HEARTBEAT_S = env_int("LAB_STREAM_HEARTBEAT_S", 15, minimum=1, maximum=300)
LAB_STREAM_POLL_MS = env_int("LAB_STREAM_POLL_MS", 500, minimum=50, maximum=10_000)
LAB_WEBHOOK_TIMEOUT_S = env_int("LAB_WEBHOOK_TIMEOUT_S", 15, minimum=1, maximum=60)  # 2xx within this many seconds = delivered
LAB_WEBHOOK_LEASE_MARGIN_S = env_int("LAB_WEBHOOK_LEASE_MARGIN_S", 30, minimum=1, maximum=600)  # a claim lasts 2 x timeout + this
LAB_WEBHOOK_RETRY_SCHEDULE = env_int_list("LAB_WEBHOOK_RETRY_SCHEDULE", [0, 5, 300, 1800, 7200, 18000, 36000, 36000])
LAB_K8S_NAMESPACE = env_str("LAB_K8S_NAMESPACE", "")
# The engine pods' model volume (a Kubernetes volume source, mounted read-only at LAB_MODEL_DIR):
# a PVC in the jobs' namespace by default; with one namespace per organization, a source every
# namespace can use (nfs, csi). docs/kubernetes.md.
LAB_K8S_MODEL_VOLUME = env_json("LAB_K8S_MODEL_VOLUME", {"persistentVolumeClaim": {"claimName": "lab-models", "readOnly": True}})
if not isinstance(LAB_K8S_MODEL_VOLUME, dict) or len(LAB_K8S_MODEL_VOLUME) != 1:
    raise ImproperlyConfigured('LAB_K8S_MODEL_VOLUME must be one volume source, e.g. {"nfs": {"server": "...", "path": "/models"}}')
# Which attempts run as the engine's three roles, one pod each (docs/kubernetes.md "Roles"): auto
# (jobs of 2 GPUs or more), split (every job that can be), single (none); a split attempt's
# orchestrator and trainer share a ReadWriteMany PVC of the jobs' namespace (without one a split
# job fails to launch), and the orchestrator's pod gets these CPU and memory requests.
LAB_K8S_ENGINE_ROLES = env_choice("LAB_K8S_ENGINE_ROLES", "auto", ("auto", "split", "single"))
LAB_K8S_SHARED_PVC = env_str("LAB_K8S_SHARED_PVC", "")
LAB_K8S_ORCHESTRATOR_CPU = env_int("LAB_K8S_ORCHESTRATOR_CPU", 4, minimum=1)
LAB_K8S_ORCHESTRATOR_MEMORY_GIB = env_int("LAB_K8S_ORCHESTRATOR_MEMORY_GIB", 16, minimum=1)


def _engine_egress(name: str) -> list[dict]:
    """Return ``name``: what engine pods may reach besides their own JobSet's pods and the
    cluster DNS (docs/kubernetes.md "Confinement"), as NetworkPolicy egress rules, each with ``to``
    (pod, namespace or ipBlock peers) and/or ``ports``; by default Lab's web pods (k8s/base/web.yaml).
    A rule with neither, or with an empty list, would allow everything and is refused."""
    default = [{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "lab-system"}},
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "lab-web"}}}],
                "ports": [{"protocol": "TCP", "port": 8000}]}]
    rules = env_json(name, default)
    fields = {"to": {"podSelector", "namespaceSelector", "ipBlock"}, "ports": {"protocol", "port", "endPort"}}
    if not isinstance(rules, list) or not all(
        isinstance(rule, dict) and rule and set(rule) <= set(fields) and all(
            isinstance(rule[key], list) and rule[key]
            and all(isinstance(item, dict) and item and set(item) <= fields[key] for item in rule[key])
            for key in rule)
        for rule in rules
    ):
        raise ImproperlyConfigured(
            f'{name} must be a JSON list of NetworkPolicy egress rules, each with a non-empty "to" '
            '(podSelector, namespaceSelector, ipBlock) and/or "ports" (protocol, port, endPort), e.g. '
            '[{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"protocol": "TCP", "port": 443}]}]')
    return rules


LAB_K8S_ENGINE_EGRESS = _engine_egress("LAB_K8S_ENGINE_EGRESS")
# Job secrets (jobs/secrets/services.py): Fernet keys, comma-separated, the first encrypts; without
# them a key derived from SECRET_KEY (so changing SECRET_KEY then loses stored secrets).
LAB_SECRETS_KEY = env_str("LAB_SECRETS_KEY", "")
# Billing (docs/billing.md): on only when STRIPE_API_KEY is set; usage is recorded either way.
LAB_TRIAL_CREDIT_USD = env_decimal("LAB_TRIAL_CREDIT_USD", "10.00", minimum=Decimal(0))
LAB_CREDIT_GRACE_USD = env_decimal("LAB_CREDIT_GRACE_USD", "0", minimum=Decimal(0))
LAB_USAGE_INTERVAL_S = env_int("LAB_USAGE_INTERVAL_S", 60, minimum=1, maximum=3600)
STRIPE_API_KEY = env_str("STRIPE_API_KEY", "")
STRIPE_WEBHOOK_SECRET = env_str("STRIPE_WEBHOOK_SECRET", "")
STRIPE_METER_EVENT_NAME = env_str("STRIPE_METER_EVENT_NAME", "lab_gpu_seconds")
STRIPE_METERED_PRICE_ID = env_str("STRIPE_METERED_PRICE_ID", "")
STRIPE_API_BASE = env_str("STRIPE_API_BASE", "")  # e.g. a stripe-mock or local fake; Stripe's own when empty
STRIPE_API_VERSION = env_str("STRIPE_API_VERSION", "")  # empty: the version pinned in billing/stripe_api.py

# Requests per minute one API key may make before it gets 429 with Retry-After.
LAB_API_RATE_LIMIT_PER_MINUTE = env_int("LAB_API_RATE_LIMIT_PER_MINUTE", 1200, minimum=1)
# Request bodies above this many bytes are refused with 413 (docs/api.md, conventions).
LAB_MAX_REQUEST_BYTES = 1024 * 1024
# Environment wheel and dataset uploads (docs/environments.md): up to 100 MB, plus multipart framing;
# the file's own size is checked against 100 MB exactly by environments.services and environments.datasets.
LAB_UPLOAD_PATH_PATTERN = r"^/(api/v1/environments|api/v1/datasets|o/[-\w]+/environments/push/|prime/api/v1/environmentshub/uploads/[^/]+)$"
LAB_MAX_UPLOAD_REQUEST_BYTES = 100 * 1024 * 1024 + 64 * 1024
# Model archive pushes (docs/models.md): up to LAB_MODEL_MAX_BYTES, plus multipart framing.
LAB_MODEL_UPLOAD_PATH_PATTERN = r"^/api/v1/models$"
# Prime's evaluation SDK (prime_evals' push_samples, which `prime eval push` calls with its default)
# uploads an evaluation's samples in JSON batches of up to 25 MB (docs/prime-compat.md).
LAB_PRIME_SAMPLES_PATH_PATTERN = r"^/prime/api/v1/evaluations/[^/]+/samples$"
LAB_PRIME_SAMPLES_MAX_BYTES = 25 * 1024 * 1024 + 64 * 1024
# The most a JSON body is read into memory; BodySizeLimitMiddleware refuses each route's excess first.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(LAB_MAX_REQUEST_BYTES, LAB_PRIME_SAMPLES_MAX_BYTES)
LAB_IDEMPOTENCY_TTL_S = 24 * 3600

# --- auth ------------------------------------------------------------------------------------
AUTH_USER_MODEL = "lab.User"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LAB_INVITATION_TTL_S = env_int("LAB_INVITATION_TTL_S", 7 * 24 * 3600, minimum=60)

EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Lab <noreply@localhost>")

# --- security (on by default whenever DEBUG is off) ---------------------------------------------
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
# Content-Security-Policy (django-csp): scripts, styles and everything else from Lab's own origin
# only; no inline scripts, inline styles, event-handler attributes or eval (htmx runs with
# allowEval off, set in templates/base.html). The dashboard keeps its JavaScript in static/js/.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'none'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "form-action": ["'self'"],
        "base-uri": ["'none'"],
        "frame-ancestors": ["'none'"],
    }
}

# --- i18n, static ----------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = LAB_DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)


def _checkpoint_storage(url: str) -> dict:
    """Return the STORAGES entry for checkpoint archives from ``LAB_STORAGE_URL``.

    Empty: the filesystem under ``LAB_DATA_DIR/checkpoints``. ``s3://bucket/prefix``: an
    S3-compatible bucket through django-storages; credentials and region come from the usual
    ``AWS_*`` variables, the endpoint from ``AWS_ENDPOINT_URL`` (MinIO, R2, a moto server).
    """
    if not url:
        return {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(LAB_DATA_DIR / "checkpoints")},
        }
    scheme, _, rest = url.partition("://")
    bucket, _, prefix = rest.partition("/")
    if scheme != "s3" or not bucket:
        raise ImproperlyConfigured(f"LAB_STORAGE_URL must be empty or s3://bucket[/prefix], not {url!r}")
    return {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": bucket,
            "location": prefix.strip("/"),
            "endpoint_url": env_str("AWS_ENDPOINT_URL") or None,
            "region_name": env_str("AWS_DEFAULT_REGION") or env_str("AWS_REGION") or None,
            "default_acl": None,
            "file_overwrite": True,
            "querystring_auth": True,
            # Signed download and upload URLs live this long (seconds).
            "querystring_expire": LAB_STORAGE_URL_EXPIRE_S,
            "addressing_style": env_choice("AWS_S3_ADDRESSING_STYLE", "path", ("path", "virtual", "auto")),
            "signature_version": "s3v4",
        },
    }


LAB_STORAGE_URL = env_str("LAB_STORAGE_URL", "")
LAB_STORAGE_URL_EXPIRE_S = env_int("LAB_STORAGE_URL_EXPIRE_S", 3600, minimum=60, maximum=7 * 24 * 3600)
# An object younger than this with no checkpoint row may be an upload in progress: the orphan
# sweep leaves it alone (seconds).
LAB_ORPHAN_GRACE_S = env_int("LAB_ORPHAN_GRACE_S", 24 * 3600, minimum=0)
# Stored objects (checkpoints, wheels, datasets) are Lab's user's alone (lab.lib.process).
FILE_UPLOAD_PERMISSIONS = 0o600
FILE_UPLOAD_DIRECTORY_PERMISSIONS = 0o700
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    "checkpoints": _checkpoint_storage(LAB_STORAGE_URL),
}
WHITENOISE_USE_FINDERS = True

# --- REST framework --------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["lab.api.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["lab.api.auth.HasProjectScope"],
    "DEFAULT_THROTTLE_CLASSES": ["lab.api.throttling.ApiKeyRateThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["lab.api.parsers.LabJSONParser"],
    "EXCEPTION_HANDLER": "lab.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "lab.api.schema.LabAutoSchema",
    "UNAUTHENTICATED_USER": None,
    "DATETIME_FORMAT": "%Y-%m-%dT%H:%M:%SZ",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Lab API",
    "DESCRIPTION": "Hosted reinforcement-learning jobs: submit, watch and fetch results.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    # 3.1: bodies are JSON Schema 2020-12, the dialect of the job spec's schema (labsdk.spec).
    "OAS_VERSION": "3.1.0",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "lab.api.schema.postprocess_lab_schema",
    ],
}

# --- logging: one JSON object per line, with the request id ----------------------------------
LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "lab.logging.RequestIdFilter"}},
    "formatters": {"json": {"()": "lab.logging.JsonFormatter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "stream": sys.stderr,
            "formatter": "json",
            "filters": ["request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.server": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}

# --- periodic tasks (celery beat) ------------------------------------------------------------
CELERY_BEAT_SCHEDULE = {
    "purge-idempotency-records": {"task": "lab.purge_idempotency_records", "schedule": 3600.0},
    "reconcile-jobs": {"task": "jobs.reconcile", "schedule": float(LAB_RECONCILE_INTERVAL_S)},
    "sweep-webhook-deliveries": {"task": "jobs.webhooks.sweep", "schedule": 5.0},
    "sweep-orphan-checkpoints": {"task": "jobs.sweep_orphan_checkpoints", "schedule": 3600.0},
    "reap-sandboxes": {"task": "sandboxes.reap", "schedule": 30.0},
    "expire-sandbox-logs": {"task": "sandboxes.expire_logs", "schedule": 3600.0},
    "reconcile-serving": {"task": "serving.reconcile", "schedule": float(LAB_RECONCILE_INTERVAL_S)},
    "sweep-environment-builds": {"task": "environments.sweep_builds", "schedule": 60.0},
    "sweep-model-builds": {"task": "jobs.sweep_model_builds", "schedule": 60.0},
    # Meter events owed after a Stripe outage (each interval's close also enqueues the task).
    "send-meter-events": {"task": "billing.send_meter_events", "schedule": 300.0},
}
