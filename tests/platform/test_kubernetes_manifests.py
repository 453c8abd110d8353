"""platform/kubernetes: every manifest validates against Kubernetes 1.33's schema (strict), and the manifests
agree with the code they deploy: settings' variable names, the URLconf's probe paths, the Celery beat
scheduler, the workers' queues and metrics ports, the management commands of the migration Job."""

from __future__ import annotations

import ast
import re
import shlex

import kubernetes_validate
import pytest
from django.conf import settings as django_settings
from django.core.management import get_commands
from django.urls import resolve

from .kustomize import (
    KUBERNETES,
    PLATFORM,
    key,
    kustomization_dirs,
    load_documents,
    patch_files,
    render,
    resource_files,
)

REPO = PLATFORM.parent
BASE = KUBERNETES / "base"
PRODUCTION = KUBERNETES / "overlays" / "production"
KUBERNETES_VERSION = "1.33"
WORKERS = {"controlplane-worker-fast": django_settings.CELERY_FAST_QUEUE,
           "controlplane-worker-slow": django_settings.CELERY_SLOW_QUEUE}

# Variables the manifests set that settings.py does not read, each with its reason.
NOT_SETTINGS = {
    "POD_IP": "downward API: the pod's IP, spliced into ALLOWED_HOSTS as $(POD_IP) for probes and scrapes",
}


def validate(obj: dict) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def rendered() -> dict[str, list[dict]]:
    return {directory.relative_to(KUBERNETES).as_posix(): render(directory) for directory in kustomization_dirs()}


def pods(objects: list[dict]):
    """(object, pod spec) of every workload."""
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            yield obj, obj["spec"]["template"]["spec"]


def containers(objects: list[dict]):
    """(object, container) of every container and init container."""
    for obj, pod in pods(objects):
        for container in pod.get("initContainers", []) + pod["containers"]:
            yield obj, container


def by_key(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {key(obj): obj for obj in objects}


def settings_variables() -> set[str]:
    """The environment variables controlplane/settings.py reads: the first argument of every env(...) call."""
    tree = ast.parse((REPO / "controlplane" / "settings.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        func = node.func
        if (isinstance(func, ast.Name) and func.id == "env") or \
                (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "env"):
            names.add(node.args[0].value)
    return names


# --- schema ----------------------------------------------------------------------------------------------------

def test_there_are_a_base_and_a_production_overlay():
    assert {d.relative_to(KUBERNETES).as_posix() for d in kustomization_dirs()} >= {"base", "overlays/production"}


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda d: d.relative_to(KUBERNETES).as_posix())
def test_it_validates_every_document_of_every_resource_file(directory):
    files = resource_files(directory)
    assert files
    for path in files:
        documents = load_documents(path)
        assert documents, f"{path} holds no object"
        for obj in documents:
            validate(obj)


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda d: d.relative_to(KUBERNETES).as_posix())
def test_it_validates_the_rendered_kustomization(directory):
    objects = render(directory)
    assert len(by_key(objects)) == len(objects), "two objects of the same kind and name"
    for obj in objects:
        validate(obj)


def test_every_yaml_file_is_a_resource_or_a_patch_of_a_kustomization():
    """No manifest escapes the validation above by being left out of every kustomization."""
    used = {path for d in kustomization_dirs() for path in resource_files(d) + patch_files(d)}
    used |= {d / "kustomization.yaml" for d in kustomization_dirs()}
    files = {path.resolve() for path in KUBERNETES.rglob("*.y*ml")}
    assert files - used == set()


# --- the pieces --------------------------------------------------------------------------------------------------

def test_the_base_has_the_pieces_of_a_deployment():
    objects = by_key(render(BASE))
    for expected in [("Namespace", "controlplane"), ("ServiceAccount", "controlplane"),
                     ("ConfigMap", "controlplane-config"), ("Secret", "controlplane-secrets"),
                     ("Deployment", "controlplane-web"), ("Deployment", "controlplane-worker-fast"),
                     ("Deployment", "controlplane-worker-slow"),
                     ("Deployment", "controlplane-beat"), ("Job", "controlplane-migrate"),
                     ("Service", "controlplane-web"), ("PodDisruptionBudget", "controlplane-web")]:
        assert expected in objects
    assert all(obj["metadata"].get("namespace", "controlplane") == "controlplane" for obj in objects.values())


def test_the_secret_template_holds_only_placeholders():
    secret = by_key(render(BASE))["Secret", "controlplane-secrets"]
    assert set(secret["stringData"]) == {"SECRET_KEY", "FIELD_ENCRYPTION_KEYS", "DATABASE_URL"}
    assert all("REPLACE-ME" in value for value in secret["stringData"].values())


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda d: d.relative_to(KUBERNETES).as_posix())
def test_every_kustomization_runs_the_production_settings(directory):
    """CONTROLPLANE_ENV=production: the settings refuse the template's placeholders and a missing encryption key
    (tests/controlplane/test_production_settings.py), and serve HTTPS only; behind the overlay's TLS ingress the
    web trusts X-Forwarded-Proto, or every request would be redirected again."""
    objects = render(directory)
    config = by_key(objects)["ConfigMap", "controlplane-config"]["data"]
    assert config["CONTROLPLANE_ENV"] == "production" and config["DEBUG"] == "false"
    if any(obj["kind"] == "Ingress" for obj in objects):
        web = by_key(objects)["Deployment", "controlplane-web"]["spec"]["template"]["spec"]["containers"][0]
        assert {e["name"]: e.get("value") for e in web["env"]}.get("TRUST_X_FORWARDED_PROTO") == "true"


def test_production_takes_the_secret_from_elsewhere_and_pins_the_image():
    objects = render(PRODUCTION)
    assert ("Secret", "controlplane-secrets") not in by_key(objects)
    images = {container["image"] for _, container in containers(objects)}
    assert len(images) == 1 and not images.pop().endswith((":dev", ":latest"))


@pytest.mark.parametrize("directory", [BASE, PRODUCTION], ids=["base", "production"])
def test_beat_is_a_single_replica_recreated_on_the_database_scheduler(directory):
    beat = by_key(render(directory))["Deployment", "controlplane-beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    command = beat["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["celery", "--app=controlplane", "beat"]
    assert "--scheduler=django_celery_beat.schedulers:DatabaseScheduler" in command  # schedules edited in the admin
    assert django_settings.CELERY_BEAT_SCHEDULER == "django_celery_beat.schedulers:DatabaseScheduler"


def test_the_web_runs_the_projects_wsgi_application_under_gunicorn_gthread():
    from django.utils.module_loading import import_string

    web = by_key(render(BASE))["Deployment", "controlplane-web"]
    command = web["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[0] == "gunicorn" and "--worker-class=gthread" in command
    assert command[1] == "controlplane.wsgi:application"
    assert django_settings.WSGI_APPLICATION == "controlplane.wsgi.application"
    assert callable(import_string("controlplane.wsgi.application"))


def test_the_web_has_a_service_and_a_disruption_budget_that_select_its_pods():
    objects = by_key(render(BASE))
    labels = objects["Deployment", "controlplane-web"]["spec"]["template"]["metadata"]["labels"]
    service, pdb = objects["Service", "controlplane-web"], objects["PodDisruptionBudget", "controlplane-web"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < objects["Deployment", "controlplane-web"]["spec"]["replicas"]


def test_the_migration_job_runs_migrate_and_existing_commands():
    job = by_key(render(BASE))["Job", "controlplane-migrate"]
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    commands = [shlex.split(part) for part in script.split("&&")]
    assert commands[0][:3] == ["python", "manage.py", "migrate"]
    assert all(c[:2] == ["python", "manage.py"] and c[2] in get_commands() for c in commands)


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_the_worker_declares_one_metrics_port_per_pool_process(name):
    """core.metrics serves pool process i on CELERY_METRICS_PORT + i, on CELERY_METRICS_ADDR: 4 processes from
    port 9100 are ports 9100 to 9103."""
    objects = by_key(render(BASE))
    config = objects["ConfigMap", "controlplane-config"]["data"]
    worker = objects["Deployment", name]["spec"]["template"]["spec"]["containers"][0]
    assert "--concurrency=4" in worker["command"]
    assert config["CELERY_METRICS_PORT"] == "9100"
    assert [(p["name"], p["containerPort"]) for p in worker["ports"]] == \
        [("metrics-0", 9100), ("metrics-1", 9101), ("metrics-2", 9102), ("metrics-3", 9103)]
    assert config["CELERY_METRICS_ADDR"] == "0.0.0.0"


@pytest.mark.parametrize("directory", [BASE, PRODUCTION], ids=["base", "production"])
def test_each_queue_has_a_worker_deployment_of_its_own(directory):
    """One Deployment per queue, consuming that queue only, its pods selected apart from the other's; every queue a
    task is routed to is consumed."""
    from controlplane.celery import app

    objects = by_key(render(directory))
    consumed = {}
    for name, queue in WORKERS.items():
        deployment = objects["Deployment", name]
        command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[:3] == ["celery", "--app=controlplane", "worker"]
        assert [arg for arg in command if arg.startswith(("--queues", "-Q"))] == [f"--queues={queue}"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        consumed[queue] = selector
        probe = deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"][-1]
        hostname = next(arg for arg in command if arg.startswith("--hostname=")).removeprefix("--hostname=")
        assert f'--destination "{hostname.replace("%h", "$HOSTNAME")}"' in probe  # pings its own worker
        assert deployment["spec"]["replicas"] >= 1
    fast, slow = consumed.values()
    assert fast != slow
    routed = {route["queue"] for route in django_settings.CELERY_TASK_ROUTES.values()}
    assert routed == set(consumed) == set(app.amqp.queues)


# --- settings and environment -----------------------------------------------------------------------------------

@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda d: d.relative_to(KUBERNETES).as_posix())
def test_every_variable_the_manifests_set_is_read_by_settings(directory):
    objects = render(directory)
    names = set()
    for obj in objects:
        if obj["kind"] in ("ConfigMap", "Secret"):
            names |= set(obj.get("data", {})) | set(obj.get("stringData", {}))
    for _, container in containers(objects):
        names |= {env["name"] for env in container.get("env", [])}
    unknown = names - settings_variables() - set(NOT_SETTINGS)
    assert not unknown, f"not read by controlplane/settings.py: {sorted(unknown)}"


def test_the_settings_parser_finds_the_variables():
    assert {"DATABASE_URL", "SECRET_KEY", "CELERY_BROKER_URL", "FIELD_ENCRYPTION_KEYS", "ALLOWED_HOSTS",
            "COSTS_PROMETHEUS_URL", "CONTROLPLANE_VAR_DIR"} <= settings_variables()
    assert "BASE_DIR" not in settings_variables()


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda d: d.relative_to(KUBERNETES).as_posix())
def test_every_container_gets_the_config_and_the_secret_and_references_earlier_variables(directory):
    objects = render(directory)
    config = by_key(objects)["ConfigMap", "controlplane-config"]["data"]
    for obj, container in containers(objects):
        refs = [ref.get("configMapRef", ref.get("secretRef"))["name"] for ref in container.get("envFrom", [])]
        assert refs == ["controlplane-config", "controlplane-secrets"], (obj["metadata"]["name"], container["name"])
        defined = set(config)
        for env in container.get("env", []):
            # Kubernetes expands $(NAME) only for variables defined before (envFrom first, then env in order).
            for name in re.findall(r"\$\((\w+)\)", env.get("value", "")):
                assert name in defined, f"{container['name']}: {env['name']} reads $({name}) before it is set"
            defined.add(env["name"])


def test_the_web_allows_its_pod_ip_as_host():
    """Kubelet probes and Prometheus send the pod IP as Host; Django answers 400 to hosts it does not allow."""
    for directory in kustomization_dirs():
        web = by_key(render(directory))["Deployment", "controlplane-web"]["spec"]["template"]["spec"]
        env = {e["name"]: e for e in web["containers"][0]["env"]}
        assert "$(POD_IP)" in env["ALLOWED_HOSTS"]["value"].split(",")
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


# --- probes ------------------------------------------------------------------------------------------------------

def test_the_probe_paths_are_the_projects_health_views():
    expected = {"startupProbe": "healthz", "livenessProbe": "healthz", "readinessProbe": "readyz"}
    probed = set()
    for _obj, container in containers(render(BASE)):
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        for probe, view in expected.items():
            http = container.get(probe, {}).get("httpGet")
            if http is None:
                continue
            match = resolve(http["path"])
            assert (match.func.__module__, match.url_name) == ("controlplane.views", view), (container["name"], probe)
            assert http["port"] in ports
            probed.add((container["name"], probe))
    assert {("web", probe) for probe in expected} <= probed


# --- security and resources --------------------------------------------------------------------------------------

@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda d: d.relative_to(KUBERNETES).as_posix())
def test_every_pod_runs_unprivileged_on_a_read_only_root_with_a_writable_var(directory):
    objects = render(directory)
    var_dir = "/app/var"
    assert by_key(objects)["ConfigMap", "controlplane-config"]["data"]["CONTROLPLANE_VAR_DIR"] == var_dir
    for _obj, pod in pods(objects):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        emptydirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        for container in pod.get("initContainers", []) + pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts.get(var_dir) in emptydirs and mounts.get("/tmp") in emptydirs, container["name"]
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind]), (container["name"], kind)


def test_the_image_user_is_the_pods_user():
    dockerfile = (PLATFORM / "Dockerfile").read_text()
    user = re.findall(r"^USER\s+(\d+):(\d+)\s*$", dockerfile, re.MULTILINE)
    assert user and user[-1] == ("10001", "10001"), "the image runs as the numeric user 10001:10001"
    for _, pod in pods(render(BASE)):
        assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (10001, 10001)


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda d: d.relative_to(KUBERNETES).as_posix())
def test_the_services_are_shared_servers_not_the_embedded_defaults(directory):
    """SQLite and the filesystem broker live in each pod's emptyDir: every pod would have its own."""
    import environ

    objects = by_key(render(directory))
    assert objects["ConfigMap", "controlplane-config"]["data"]["CELERY_BROKER_URL"].startswith(("redis://", "amqp://"))
    secret = objects.get(("Secret", "controlplane-secrets"))
    if secret is not None:
        database = environ.Env.db_url_config(secret["stringData"]["DATABASE_URL"])
        assert database["ENGINE"] == "django.db.backends.postgresql"
