"""The manifests the kubernetes backend builds (``runners.kubernetes.manifests``), without a cluster: they validate
against the Kubernetes 1.33 schema, carry the contract's labels, give multi-node training torchrun's rendezvous
environment, keep on-demand work off spot nodes and tolerate spot where asked, and mount checkpoints.

Expected values are written here from the contract of docs/design.md, Kubernetes objects (labels, GPU resource,
node selector) and from the workload's own numbers, not read from the module.
"""

from __future__ import annotations

import pytest

from runners.kubernetes import manifests as m

from .steps import validate, workload


@pytest.mark.parametrize("spot", [True, False])
@pytest.mark.parametrize("kind,nodes", [("training", 1), ("training", 3), ("inference", 1)])
def test_it_builds_manifests_that_validate_for_1_33(spot, kind, nodes):
    for obj in m.manifests(workload(spot=spot, kind=kind, nodes=nodes)):
        validate(obj)
        # docs/design.md, Kubernetes objects: every object carries the team, job and attempt labels; a serving
        # replica's also its index; a serving job's Service is the job's (no attempt's), marked as its endpoint
        labels = {"controlplane.io/team": "alpha", "controlplane.io/job": "7", "controlplane.io/attempt": "11"}
        if kind == "inference" and obj["kind"] == "Service":
            labels = {"controlplane.io/team": "alpha", "controlplane.io/job": "7", "controlplane.io/endpoint": "true"}
        elif kind == "inference":
            labels["controlplane.io/replica"] = "0"
        assert obj["metadata"]["labels"] == labels
    validate(m.namespace("cp-alpha", "alpha"))


def test_it_gives_multi_node_pods_torchrun_rendezvous_env():
    service, job = m.manifests(workload(nodes=3))
    assert service["spec"]["clusterIP"] == "None" and service["metadata"]["name"] == "job-7-1"
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 900
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "job-7-1" and pod["restartPolicy"] == "Never"
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["MASTER_ADDR"]["value"] == "job-7-1-0.job-7-1.cp-alpha.svc"
    assert env["MASTER_PORT"]["value"] == "29500" and env["WORLD_SIZE"]["value"] == "3"
    index_ref = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == index_ref
    assert env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == index_ref
    assert env["A"]["value"] == "1"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "cpu": "4000m", "memory": "33280Mi"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.mark.parametrize("key,value", [
    ("eks.amazonaws.com/capacityType", "SPOT"), ("karpenter.sh/capacity-type", "spot"),
    ("cloud.google.com/gke-spot", "true"), ("cloud.google.com/gke-preemptible", "true"),
    ("kubernetes.azure.com/scalesetpriority", "spot"), ("oci.oraclecloud.com/oke-is-preemptible", "true"),
])
def test_it_selects_and_tolerates_spot_nodes_per_cloud_and_keeps_on_demand_work_off_them(key, value):
    """docs/design.md, Kubernetes objects: spot pods require one provider's spot label and tolerate its taint
    (any value: OKE documents the taint's key only), on-demand pods exclude every one."""
    spot_pod = m.training_job(workload(spot=True, nodes=1))["spec"]["template"]["spec"]
    terms = spot_pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]} in terms
    assert {"key": key, "operator": "Exists", "effect": "NoSchedule"} in spot_pod["tolerations"]
    od_pod = m.training_job(workload(spot=False, nodes=1))["spec"]["template"]["spec"]
    (term,) = od_pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": key, "operator": "NotIn", "values": [value]} in term["matchExpressions"]
    assert not any(t.get("key") == key for t in od_pod["tolerations"])


def _pod_specs(objs: list[dict]) -> list[dict]:
    return [o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Job", "Deployment")]


@pytest.mark.parametrize("claim", ["", "checkpoints"])
@pytest.mark.parametrize("kind,nodes", [("training", 1), ("training", 3), ("inference", 1)])
def test_it_mounts_checkpoints_from_the_claim_or_an_empty_dir_and_sets_checkpoint_dir(claim, kind, nodes):
    objs = m.manifests(workload(kind=kind, nodes=nodes, checkpoint_claim=claim))
    for obj in objs:
        validate(obj)
    (pod,) = _pod_specs(objs)
    (volume,) = pod["volumes"]
    read_only = kind == "inference"
    if claim:
        assert volume["persistentVolumeClaim"]["claimName"] == "checkpoints"
        assert volume["persistentVolumeClaim"].get("readOnly", False) is read_only
    else:
        assert volume == {"name": "checkpoints", "emptyDir": {}}
    for container in pod["containers"]:
        assert {"name": "CHECKPOINT_DIR", "value": "/checkpoints"} in container["env"]
        (mount,) = container["volumeMounts"]
        assert mount["name"] == volume["name"] and mount["mountPath"] == "/checkpoints"
        assert mount.get("readOnly", False) is read_only
        assert mount.get("subPath") == ("job-7" if claim else None)


def test_every_attempt_of_a_job_shares_its_checkpoint_subpath_and_other_jobs_do_not():
    def subpath(**kw):
        (pod,) = _pod_specs(m.manifests(workload(checkpoint_claim="checkpoints", **kw)))
        return pod["containers"][0]["volumeMounts"][0]["subPath"]

    first = subpath(name="job-7-1", attempt_id=11, attempt_number=1)
    second = subpath(name="job-7-2", attempt_id=12, attempt_number=2)
    assert first == second == "job-7"
    assert subpath(name="job-8-1", job_id=8, attempt_id=13, attempt_number=1) == "job-8" != first


@pytest.mark.parametrize("nodes", [1, 3])
def test_training_pods_declare_the_workload_metrics_port_env_and_prometheus_annotations(nodes):
    objs = m.manifests(workload(nodes=nodes, metrics_port=9464))
    for obj in objs:
        validate(obj)
    (job,) = [o for o in objs if o["kind"] == "Job"]
    template = job["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9464} in container["ports"]
    assert ({"name": "rendezvous", "containerPort": 29500} in container["ports"]) is (nodes > 1)
    assert [e for e in container["env"] if e["name"] == "CONTROLPLANE_METRICS_PORT"] == [
        {"name": "CONTROLPLANE_METRICS_PORT", "value": "9464"}]
    assert template["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "9464",
                                                   "prometheus.io/path": "/metrics"}
    assert "annotations" not in job["metadata"] or "prometheus.io/scrape" not in job["metadata"]["annotations"]


def test_a_job_s_own_metrics_port_variable_does_not_override_the_declared_one():
    job = m.training_job(workload(nodes=1, metrics_port=9464, env=(("CONTROLPLANE_METRICS_PORT", "1"),)))
    validate(job)
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "CONTROLPLANE_METRICS_PORT"] == ["9464"]


@pytest.mark.parametrize("kind,port", [("training", 0), ("inference", 9464)])
def test_without_a_metrics_port_or_for_serving_no_metrics_port_is_declared(kind, port):
    for obj in m.manifests(workload(kind=kind, nodes=1, metrics_port=port)):
        validate(obj)
        if obj["kind"] in ("Job", "Deployment"):
            template = obj["spec"]["template"]
            (container,) = template["spec"]["containers"]
            assert all(p["name"] != "metrics" for p in container.get("ports") or [])
            assert all(e["name"] != "CONTROLPLANE_METRICS_PORT" for e in container["env"])
            # No scrape annotations (a serving replica's template names its checkpoint job, nothing else).
            assert not any(k.startswith("prometheus.io/") for k in template["metadata"].get("annotations") or {})


@pytest.mark.parametrize("path", ["/healthz", "/v1/ready"])
def test_serving_replicas_are_ready_only_while_their_health_path_answers(path):
    w = workload(kind="inference", nodes=1, replicas=3, port=8080, health_path=path)
    service, *deployments = m.manifests(w)
    validate(service)
    assert len(deployments) == 3  # a Deployment per replica
    for deployment in deployments:
        validate(deployment)
        probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
        assert probe["httpGet"] == {"path": path, "port": 8080}
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()  # every replica's pods are behind it
    assert service["spec"]["ports"][0]["targetPort"] == 8080 and "clusterIP" not in service["spec"]
    assert service["spec"]["type"] == "ClusterIP"


@pytest.mark.parametrize("jobset", [False, True])
def test_a_role_pods_hostname_is_a_dns_label_for_the_largest_job_id_attempt_and_role_name(jobset):
    """A pod of an Indexed Job is named by the kubelet ``<Job name>-<index>`` as its hostname, which must be a
    DNS-1123 label (63 characters at most, Kubernetes docs "DNS for Services and Pods"). The longest case: the
    largest bigint job id, attempt 999, a 12-character role name, pod index 998."""
    import re
    import uuid

    from jobs.models import attempt_object_name

    name = attempt_object_name(2**63 - 1, 999, uuid.uuid4())
    w = workload(name=name, jobset=jobset)
    hostname = f"{m.role_job_name(w, 'r' * 12)}-998"
    assert len(hostname) <= 63, (len(hostname), hostname)
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", hostname)


def _pod_templates(objects: list[dict]) -> list[dict]:
    """The pod specs in ``objects``: a Job's or Deployment's template, each replicated Job's of a JobSet."""
    specs = []
    for obj in objects:
        spec = obj.get("spec", {})
        if "template" in spec:
            specs.append(spec["template"]["spec"])
        for replicated in spec.get("replicatedJobs", []):
            specs.append(replicated["template"]["spec"]["template"]["spec"])
    return specs


@pytest.mark.parametrize("shape", ["one-node", "multi-node", "inference", "multi-role", "jobset"])
def test_no_pod_gets_the_namespaces_service_links_in_its_environment(shape):
    """The kubelet puts variables of every Service of a pod's namespace in its environment unless the pod says
    ``enableServiceLinks: false``; the platform makes a Service per multi-node and serving job, so every pod template
    it makes, of every shape, says so, and still validates."""
    roles = (m.Role("learner", "img:1", ("python", "learn.py"), pods=2),
             m.Role("rollout", "img:1", ("python", "serve.py"), pods=1, port=8000))
    w = {"one-node": workload(nodes=1), "multi-node": workload(nodes=2),
         "inference": workload(kind="inference", nodes=1, replicas=2, gpus_per_node=1),
         "multi-role": workload(kind="multi-role", roles=roles),
         "jobset": workload(kind="multi-role", roles=roles, jobset=True)}[shape]
    objects = m.manifests(w)
    pods = _pod_templates(objects)
    assert pods, objects
    assert all(p.get("enableServiceLinks") is False for p in pods), pods
    for obj in objects:
        if obj["kind"] in ("Job", "Deployment", "Service"):
            validate(obj)
