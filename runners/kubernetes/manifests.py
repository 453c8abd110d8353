"""Kubernetes manifests of an attempt, as plain dicts: training Job (+ headless Service), inference Deployment + Service,
and for a multi-role job an Indexed Job and a headless Service per role, or one JobSet of them.

Pure functions of a ``Workload`` (no database, no network), so tests can
validate every shape against the official schema (``kubernetes-validate``).
Conventions: Kubernetes docs "Indexed Job for parallel processing with static
work assignment", the Job pod hostname/subdomain DNS rule, and each cloud's
spot documentation (``SPOT_LABELS``: EKS managed node groups, Karpenter, GKE Spot and
preemptible VMs, AKS Spot node pools, OKE preemptible capacity).
"""

from __future__ import annotations

import dataclasses

LABEL_TEAM = "controlplane.io/team"
LABEL_JOB = "controlplane.io/job"
LABEL_ATTEMPT = "controlplane.io/attempt"
# The role of a multi-role attempt an object or pod belongs to (docs/adr/0039-multi-role-jobs.md), and on a role's
# Job whether the attempt waits for it ("true") or it is a server ("false"): the cluster's objects alone tell
# the attempt's state.
LABEL_ROLE = "controlplane.io/role"
COMPLETION_ANNOTATION = "controlplane.io/completion"
# A serving attempt's replica index on its Deployment and pods (docs/adr/0041-autoscaled-serving.md): each replica is
# a Deployment of its own, pinned to the node admission booked for it, so a scale-down deletes exactly the released
# replicas. And on a serving job's Service (named for the job, kept across its attempts), that it is the endpoint.
LABEL_REPLICA = "controlplane.io/replica"
LABEL_ENDPOINT = "controlplane.io/endpoint"
#: The Service types a serving job's endpoint may have (``settings.K8S_SERVICE_TYPE``): in the cluster only, on a
#: port of every node, or behind the cloud's load balancer (Kubernetes "Service", "Publishing Services").
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
# The attempt's globally unique id and the installation's (ADR 0011): objects are matched to attempts by these.
LABEL_ATTEMPT_UID = "controlplane.io/attempt-uid"
LABEL_INSTALLATION = "controlplane.io/installation"
# What a restored control plane needs to rebuild the attempt's rows (JSON: team, submitter, job spec and columns,
# node pool, price), on the Job or Deployment; and the ConfigMap that records an attempt's end (``end_record``).
RECORD_ANNOTATION = "controlplane.io/record"
# A serving replica's pod template: the training job whose checkpoint it loads (what a rollout changes per replica).
CHECKPOINT_ANNOTATION = "controlplane.io/checkpoint-job"
# A serving replica's Deployment started by a rollout and not yet ready: its end is the rollout's to judge.
PROBATION_ANNOTATION = "controlplane.io/rollout-probation"
END_RECORD_LABEL = "controlplane.io/end-of"
END_RECORD_PREFIX = "end-"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_LABEL = "kubernetes.io/hostname"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
CONTAINER = "main"
# Checkpoint volume: its name in the pod spec and where every container mounts it (env CHECKPOINT_DIR).
CHECKPOINT_VOLUME = "checkpoints"
CHECKPOINT_DIR = "/checkpoints"
# The workload-metrics port of training pods (``jobs.efficiency.protocol``): its container port's name, the env
# variable that tells the workload, its path, and the conventional annotations Prometheus' kubernetes_sd
# relabelling reads (``prometheus.io/scrape``, ``/port``, ``/path``).
METRICS_PORT_NAME = "metrics"
METRICS_PORT_ENV = "CONTROLPLANE_METRICS_PORT"
METRICS_PATH = "/metrics"


@dataclasses.dataclass(frozen=True)
class SpotLabel:
    """A node label that marks spot (preemptible) capacity: its ``key``, the ``value`` it has on such nodes, who
    sets it (``platform``) and the public page documenting it (``source``)."""

    key: str
    value: str
    platform: str
    source: str


#: Every node label a provider or provisioner documents for spot or preemptible capacity. One table for node pool
#: discovery (``nodepools.capacity_type``: a node with any row's label and value is spot, priced at the spot price)
#: and for scheduling (``_scheduling``: spot pods require one of them and tolerate a taint of its key; on-demand pods
#: exclude them all), whatever the cluster's provider: the label depends on what provisioned the node (Karpenter
#: runs on EKS, AKS and OKE alike), not on the cloud. Values are matched exactly, as node affinity does.
SPOT_LABELS: tuple[SpotLabel, ...] = (
    SpotLabel("eks.amazonaws.com/capacityType", "SPOT", "Amazon EKS managed node groups",
              "https://docs.aws.amazon.com/eks/latest/userguide/managed-node-groups.html"),
    SpotLabel("karpenter.sh/capacity-type", "spot", "Karpenter (EKS Auto Mode, AKS node auto-provisioning, OKE)",
              "https://karpenter.sh/docs/concepts/scheduling/#well-known-labels"),
    SpotLabel("cloud.google.com/gke-spot", "true", "GKE Spot VMs",
              "https://cloud.google.com/kubernetes-engine/docs/how-to/spot-vms"),
    SpotLabel("cloud.google.com/gke-preemptible", "true", "GKE preemptible VMs",
              "https://cloud.google.com/kubernetes-engine/docs/how-to/preemptible-vms"),
    SpotLabel("kubernetes.azure.com/scalesetpriority", "spot", "AKS Spot node pools",
              "https://learn.microsoft.com/en-us/azure/aks/spot-node-pool"),
    SpotLabel("oci.oraclecloud.com/oke-is-preemptible", "true", "OKE preemptible capacity",
              "https://docs.oracle.com/iaas/Content/ContEng/Tasks/contengusingpreemptiblecapacity.htm"),
)


def is_spot(labels: dict) -> bool:
    """Whether a node with ``labels`` (its ``metadata.labels``) is spot capacity: it carries a ``SPOT_LABELS`` row's
    key with that row's value."""
    return any(labels.get(row.key) == row.value for row in SPOT_LABELS)


@dataclasses.dataclass(frozen=True)
class Role:
    """One role of a multi-role attempt (``spec.roles.<name>``, docs/adr/0039-multi-role-jobs.md): what its pods run
    (``image``, ``command``, ``args``, ``env``), how many (``pods``), what each holds (``gpus_per_node`` GPUs,
    ``cpu`` cores, ``memory_gib`` GiB), the port they serve (``port``; None: none) and whether the job waits for it
    (``completion``); ``node_names`` the nodes admission booked for its pods (empty: any node the selectors allow)."""

    name: str
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    pods: int = 1
    gpus_per_node: int = 1
    cpu: float | None = None
    memory_gib: float | None = None
    port: int | None = None
    completion: bool = True
    node_names: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Workload:
    """What an attempt runs, flattened from Job, JobAttempt, NodePool and Accelerator.

    ``cpu`` in cores, ``memory_gib`` in GiB, ``max_runtime_seconds`` in
    seconds; ``gpu_product`` is the node label value of the accelerator
    (empty: no accelerator selector); ``spot`` when the attempt's node pool is spot;
    ``checkpoint_claim`` the team namespace's PersistentVolumeClaim holding
    checkpoints (empty: an emptyDir, see ``checkpoint_volume``);
    ``checkpoint_uri`` the job's directory in the object store shared by every
    cluster (``checkpoint_uri()``; empty: no env CHECKPOINT_URI);
    ``checkpoint_job_id`` the job whose checkpoint directory is mounted (a
    serving job's ``spec.checkpoint_from``; None: ``job_id``).
    ``node_names`` the nodes admission chose (empty: any node the selectors allow).
    ``metrics_port`` the port a training pod may serve its workload metrics on (0: none declared).
    ``array_env`` the variables of a job array's element (``jobs.arrays.element_env``: its array, index, count
    and sweep parameters; empty for a job of its own).
    ``roles`` a multi-role attempt's roles in name order (``kind`` ``multi-role``; empty otherwise);
    ``role`` the name of the role a per-role workload stands for (``role_workload``; "": the whole attempt).
    ``jobset``: the multi-role attempt is one JobSet (``jobset``) rather than a Job and a Service per role.
    ``subdomain``: the headless Service whose subdomain the pods are named under ("": the one named ``name``).
    ``service_type``: the serving job's Service type (``SERVICE_TYPES``; ``settings.K8S_SERVICE_TYPE``).
    ``replica``: the replica index a per-replica workload stands for (``replica_workload``; None: the whole attempt).
    """

    name: str
    namespace: str
    team: str
    job_id: int
    attempt_id: int
    attempt_number: int
    kind: str
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    nodes: int = 1
    gpus_per_node: int = 1
    # The extended resource each pod asks ``gpus_per_node`` of: nvidia.com/gpu, or for a job on part of one GPU
    # the slice or MIG device its node advertises (``shared_gpu_resource``, ADR 0040).
    gpu_resource: str = GPU_RESOURCE
    cpu: float | None = None
    memory_gib: float | None = None
    gpu_product: str = ""
    spot: bool = False
    max_runtime_seconds: int = 3600
    replicas: int = 1
    port: int = 8000
    health_path: str = "/healthz"  # a serving pod's readiness path (spec.health_path)
    master_port: int = 29500
    checkpoint_claim: str = ""
    checkpoint_uri: str = ""
    checkpoint_job_id: int | None = None  # whose checkpoints the pods mount: a serving job's training job
    peak_tflops: str = ""  # the accelerator's catalog peak dense BF16 TFLOP/s per GPU (env PEAK_TFLOPS); "": unknown
    node_names: tuple[str, ...] = ()
    attempt_uid: str = ""  # the attempt's uid; "": an attempt made before uids (its objects keep the old labels)
    installation: str = ""  # the installation's uid
    record: str = ""  # RECORD_ANNOTATION's JSON ("": none)
    metrics_port: int = 0  # training pods' workload-metrics port (settings.K8S_METRICS_PORT); 0: none
    array_env: tuple[tuple[str, str], ...] = ()  # CONTROLPLANE_ARRAY_* and SWEEP_* of an array's element
    # What a pod on part of one GPU holds (ADR 0040; ``runners.kubernetes.runner.share_env``): CONTROLPLANE_GPU_*.
    share_env: tuple[tuple[str, str], ...] = ()
    roles: tuple[Role, ...] = ()  # a multi-role attempt's roles, in name order
    role: str = ""  # the role a per-role workload stands for (``role_workload``)
    jobset: bool = False  # a multi-role attempt as one JobSet (the cluster serves ``JOBSET_API_VERSION``)
    subdomain: str = ""  # the headless Service the pods are named under ("": ``name``)
    service_type: str = "ClusterIP"  # a serving job's Service type (settings.K8S_SERVICE_TYPE)
    replica: int | None = None  # the replica a per-replica workload stands for (``replica_workload``)
    # A serving attempt's replica indexes in booking order (``jobs.replica_loss.replica_slots``): slot ``k`` of
    # ``node_names`` is the Deployment of index ``replica_slots[k]``; empty: indexes 0..replicas-1 in order.
    replica_slots: tuple[int, ...] = ()

    @property
    def slots(self) -> tuple[int, ...]:
        """The replica indexes of a serving workload, in the order of its booked nodes (``replica_slots``, else
        ``0 .. replicas-1``)."""
        return self.replica_slots or tuple(range(max(1, self.replicas)))

    @property
    def labels(self) -> dict[str, str]:
        """The platform labels every object and pod carries: team, job, attempt id, and (with a uid) the
        attempt's uid and the installation's (UUIDs: 36 characters, valid label values); a role's objects and
        pods also their role (``LABEL_ROLE``), a serving replica's its index (``LABEL_REPLICA``)."""
        labels = {LABEL_TEAM: self.team, LABEL_JOB: str(self.job_id), LABEL_ATTEMPT: str(self.attempt_id)}
        if self.attempt_uid:
            labels.update({LABEL_ATTEMPT_UID: self.attempt_uid, LABEL_INSTALLATION: self.installation})
        if self.role:
            labels[LABEL_ROLE] = self.role
        if self.replica is not None:
            labels[LABEL_REPLICA] = str(self.replica)
        return labels

    @property
    def owner_selector(self) -> dict[str, str]:
        """The labels that pick this attempt's pods: its uid (its id for an attempt made before uids); a role's
        pods also by their role (the pods of one role repel each other, those of different roles may share a node),
        a serving replica's by its index (each replica's Deployment selects its own pod alone)."""
        selector = {LABEL_ATTEMPT_UID: self.attempt_uid} if self.attempt_uid else {LABEL_ATTEMPT: str(self.attempt_id)}
        if self.role:
            selector[LABEL_ROLE] = self.role
        if self.replica is not None:
            selector[LABEL_REPLICA] = str(self.replica)
        return selector

    @property
    def master_addr(self) -> str:
        """DNS name of the pod of completion index 0: ``<job>-0.<headless service>.<namespace>.svc``."""
        if self.nodes == 1:
            return "127.0.0.1"
        return f"{self.name}-0.{self.subdomain or self.name}.{self.namespace}.svc"


def namespace(name: str, team: str) -> dict:
    """A v1 Namespace labelled with its team."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {LABEL_TEAM: team}}}


def _metadata(w: Workload, owner: bool = False) -> dict:
    """Name, namespace and labels; on the object that owns the pods (``owner``) also the record annotation."""
    meta = {"name": w.name, "namespace": w.namespace, "labels": dict(w.labels)}
    if owner and w.record:
        meta["annotations"] = {RECORD_ANNOTATION: w.record}
    return meta


def end_record(in_namespace: str, object_name: str, labels: dict[str, str], record: dict) -> dict:
    """The v1 ConfigMap ``end-<object name>`` that records an attempt's end in the cluster (ADR 0011).

    Written before the platform deletes the attempt's objects, kept for
    ``settings.END_RECORD_RETENTION_SECONDS``; ``record`` (strings: uid,
    job_state, end_reason, started_at, ended_at, exit_code...) goes in ``data``. Carries the attempt's labels but
    ``LABEL_JOB``, so listings of the platform's workloads never count it, and ``END_RECORD_LABEL`` = the uid.
    """
    kept = {k: v for k, v in labels.items() if k != LABEL_JOB}
    kept[END_RECORD_LABEL] = record.get("uid") or labels.get(LABEL_ATTEMPT, "")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{END_RECORD_PREFIX}{object_name}"[:253], "namespace": in_namespace, "labels": kept},
            "data": {k: "" if v is None else str(v) for k, v in record.items()}}


def _quantity_cpu(cores: float) -> str:
    return f"{round(cores * 1000)}m"


def _quantity_memory(gib: float) -> str:
    return f"{round(gib * 1024)}Mi"


def shared_gpu_resource(sharing: str, slice_resource: str, mig_profile: str) -> str:
    """The extended resource the one pod of a job on part of one GPU asks one of, on a node shared as ``sharing``
    (``runners.Node.gpu_sharing``) whose slices are ``slice_resource`` (ADR 0040; NVIDIA device plugin README,
    "Shared Access to GPUs", and GPU feature discovery's MIG strategies): under the MIG mixed strategy the profile's
    own resource ``nvidia.com/mig-<profile>``; under the single strategy ``nvidia.com/gpu`` (every device is of the
    one profile); on a time-sliced or MPS node one slice, ``nvidia.com/gpu`` or, renamed,
    ``nvidia.com/gpu.shared``."""
    if mig_profile and sharing == "mig-mixed":
        return f"nvidia.com/mig-{mig_profile}"
    if sharing in ("time-slicing", "mps") and slice_resource:
        return slice_resource
    return GPU_RESOURCE


def _resources(w: Workload) -> dict:
    """GPU limits (extended resources must have limit == request), CPU and memory requests = limits."""
    limits: dict[str, str] = {}
    if w.gpus_per_node:
        limits[w.gpu_resource] = str(w.gpus_per_node)
    if w.cpu:
        limits["cpu"] = _quantity_cpu(w.cpu)
    if w.memory_gib:
        limits["memory"] = _quantity_memory(w.memory_gib)
    resources: dict = {"limits": limits}
    requests = {k: v for k, v in limits.items() if k != w.gpu_resource}
    if requests:
        resources["requests"] = requests
    return resources


def _scheduling(w: Workload) -> dict:
    """nodeSelector, affinity and tolerations: the accelerator, and spot capacity only (spot) or never (on-demand).

    Spot: nodes carrying any ``SPOT_LABELS`` row (one nodeSelectorTerm each:
    terms are ORed), tolerating a NoSchedule taint of any row's key whatever
    its value (AKS taints ``=spot``, OKE documents the key only, GKE's
    optional taints repeat the label). On-demand: a single term excluding
    every row (NotIn also matches nodes without the label), no spot taint
    tolerated. So a node is spot for pricing exactly when spot pods may run
    there and on-demand pods may not. With
    ``node_names``, every term also requires ``kubernetes.io/hostname`` in
    them. The pods of a multi-node training attempt repel each other per
    node (required), so each lands on a distinct chosen node. The replicas of
    an inference attempt may share a node, as placement may have put them
    (``PlacementRequest.share_nodes``, ADR 0019): each is a Deployment of its
    own (``replica_workload``) pinned to its one booked node, so the
    kube-scheduler puts every replica where admission booked it.
    """
    out: dict = {}
    if w.gpu_product:
        out["nodeSelector"] = {GPU_PRODUCT_LABEL: w.gpu_product}
    # GPU nodes are tainted nvidia.com/gpu:NoSchedule (GPU operator, managed node groups); a CPU-only pod does not
    # tolerate it, so it lands on CPU nodes and never takes a GPU node's CPUs.
    tolerations = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] if w.gpus_per_node else []
    if w.spot:
        terms = [{"matchExpressions": [{"key": row.key, "operator": "In", "values": [row.value]}]} for row in SPOT_LABELS]
        tolerations += [{"key": row.key, "operator": "Exists", "effect": "NoSchedule"} for row in SPOT_LABELS]
    else:
        terms = [{"matchExpressions": [{"key": row.key, "operator": "NotIn", "values": [row.value]}
                                       for row in SPOT_LABELS]}]
    # Pinned to the nodes admission chose (a node holding several replicas is listed once).
    names = list(dict.fromkeys(w.node_names))
    if names:
        pin = {"key": HOSTNAME_LABEL, "operator": "In", "values": names}
        terms = [{"matchExpressions": t["matchExpressions"] + [pin]} for t in terms]
    out["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    repel = {"labelSelector": {"matchLabels": w.owner_selector}, "topologyKey": HOSTNAME_LABEL}
    if len(names) > 1:  # one pod per node
        out["affinity"]["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [repel]}
    if tolerations:
        out["tolerations"] = tolerations
    return out


def _platform_env(w: Workload) -> list[dict]:
    env = [
        {"name": "CONTROLPLANE_JOB_ID", "value": str(w.job_id)},
        {"name": "CONTROLPLANE_ATTEMPT", "value": str(w.attempt_number)},
        {"name": "CONTROLPLANE_TEAM", "value": w.team},
        *({"name": name, "value": value} for name, value in w.array_env),
        *({"name": name, "value": value} for name, value in w.share_env),
    ]
    if w.peak_tflops:
        env.append({"name": "PEAK_TFLOPS", "value": w.peak_tflops})
    return env


def rendezvous_env(w: Workload) -> list[dict]:
    """torchrun's variables: MASTER_ADDR/PORT, WORLD_SIZE, NODE_RANK, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE for
    one process per node, and torchrun's own options as ``PET_*`` (``PET_NNODES``, ``PET_NPROC_PER_NODE`` = the
    node's GPUs, at least 1, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``), so a bare
    ``torchrun train.py`` forms one group across the nodes as under Kubeflow Trainer's torch runtime
    (torch.distributed.run reads ``PET_<OPTION>`` for an option not given on its command line).

    NODE_RANK and RANK come from the pod's completion index (downward API on
    the ``batch.kubernetes.io/job-completion-index`` annotation; Kubernetes
    also sets JOB_COMPLETION_INDEX itself in Indexed Jobs).
    """
    if w.nodes > 1:
        index = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}
        rank = [{"name": name, "valueFrom": index} for name in ("NODE_RANK", "RANK", "PET_NODE_RANK")]
    else:
        rank = [{"name": name, "value": "0"} for name in ("NODE_RANK", "RANK", "PET_NODE_RANK")]
    return [
        {"name": "MASTER_ADDR", "value": w.master_addr},
        {"name": "MASTER_PORT", "value": str(w.master_port)},
        {"name": "WORLD_SIZE", "value": str(w.nodes)},
        *rank,
        {"name": "LOCAL_RANK", "value": "0"},
        {"name": "LOCAL_WORLD_SIZE", "value": "1"},
        {"name": "PET_NNODES", "value": str(w.nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(max(1, w.gpus_per_node))},
        {"name": "PET_MASTER_ADDR", "value": w.master_addr},
        {"name": "PET_MASTER_PORT", "value": str(w.master_port)},
    ]


def checkpoint_subpath(job_id: int) -> str:
    """Directory of a job's checkpoints inside the claim: ``job-<job id>``, the same for every attempt of the job."""
    return f"job-{job_id}"


def checkpoint_uri(store_uri: str, team_slug: str, job_id: int) -> str:
    """The job's checkpoint directory in the shared store: ``<store_uri>/<team slug>/job-<job id>``.

    ``store_uri`` is ``settings.CHECKPOINT_STORE_URI`` (e.g.
    ``s3://ml-checkpoints/controlplane``; trailing slashes are ignored). A
    function of the team and job only, so every attempt of the job, on every
    cluster and cloud, reads and writes the same place and a recovered attempt
    resumes from the job's last uploaded checkpoint. Empty ``store_uri``: empty
    (no store). A plain path (no scheme) is a local path to fsspec, as file://.
    """
    if not store_uri:
        return ""
    scheme, sep, rest = store_uri.partition("://")  # never strip the scheme's "//": "memory:" is a local path
    base = f"{scheme}://{rest.rstrip('/')}" if sep else store_uri.rstrip("/")
    return f"{base}/{team_slug}/{checkpoint_subpath(job_id)}"


def checkpoint_volume(w: Workload, read_only: bool = False) -> dict:
    """The pod volume behind ``/checkpoints`` (env CHECKPOINT_DIR).

    With ``checkpoint_claim`` (``settings.K8S_CHECKPOINT_CLAIM``): that
    PersistentVolumeClaim, which the operator provisions in each team
    namespace (e.g. ReadWriteMany on shared storage, present on every cluster
    that may run the team's jobs), so a recovered attempt, on another cluster
    too, resumes from the job's last checkpoint. Without: an emptyDir, which
    dies with the pod, so the workload code is the same but a recovered
    attempt starts over from step 0.
    """
    if w.checkpoint_claim:
        claim: dict = {"claimName": w.checkpoint_claim}
        if read_only:
            claim["readOnly"] = True
        return {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": claim}
    return {"name": CHECKPOINT_VOLUME, "emptyDir": {}}


def checkpoint_mount(w: Workload, read_only: bool = False) -> dict:
    """The container's mount of ``checkpoint_volume`` at ``/checkpoints``: the job's subPath of the claim, if any."""
    mount: dict = {"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_DIR}
    if w.checkpoint_claim:
        mount["subPath"] = checkpoint_subpath(w.checkpoint_job_id or w.job_id)
    if read_only:
        mount["readOnly"] = True
    return mount


def checkpoint_env(w: Workload) -> list[dict]:
    """CHECKPOINT_DIR (``/checkpoints``, the local working directory) and, with a store, CHECKPOINT_URI.

    CHECKPOINT_URI is ``w.checkpoint_uri`` unless the job's own spec env sets
    CHECKPOINT_URI (e.g. a serving job naming the store directory of the
    training job it serves): that one is kept and not duplicated.
    """
    env = [{"name": "CHECKPOINT_DIR", "value": CHECKPOINT_DIR}]
    if w.checkpoint_uri and not any(name == "CHECKPOINT_URI" for name, _ in w.env):
        env.append({"name": "CHECKPOINT_URI", "value": w.checkpoint_uri})
    return env


def container_env(w: Workload, platform: list[dict]) -> list[dict]:
    """The platform's variables first (``platform`` and ``checkpoint_env``), then the job's own ``env``.

    Kubernetes expands ``$(VAR)`` in an env value only for variables defined
    earlier in the list, so a job's value may use ``$(NODE_RANK)`` or
    ``$(MASTER_ADDR)``. A job variable naming one the platform sets
    (CHECKPOINT_DIR, MASTER_ADDR, CONTROLPLANE_*) is left out: the platform's
    value holds, once, as on the local runner; CHECKPOINT_URI set by the job
    is the job's (``checkpoint_env`` leaves its own out then).
    """
    env = platform + checkpoint_env(w)
    names = {e["name"] for e in env}
    return env + [{"name": k, "value": v} for k, v in w.env if k not in names]


def _container(w: Workload, env: list[dict], ports: list[dict], read_only_checkpoints: bool = False) -> dict:
    container = {"name": CONTAINER, "image": w.image, "env": container_env(w, env),
                 "resources": _resources(w), "volumeMounts": [checkpoint_mount(w, read_only_checkpoints)]}
    if w.command:  # none: the image's ENTRYPOINT runs, with ``args``
        container["command"] = list(w.command)
    if w.args:
        container["args"] = list(w.args)
    if ports:
        container["ports"] = ports
    return container


def metrics_annotations(w: Workload) -> dict[str, str]:
    """The pod annotations by which a Prometheus with the usual ``kubernetes_sd`` relabelling (the example
    configuration of the Prometheus repository, the prometheus-community Helm chart) scrapes the workload's
    metrics itself: ``prometheus.io/scrape: "true"``, ``prometheus.io/port`` and ``prometheus.io/path``; {} without
    a metrics port."""
    if not w.metrics_port:
        return {}
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(w.metrics_port),
            "prometheus.io/path": METRICS_PATH}


def training_job(w: Workload) -> dict:
    """A batch/v1 Job: Indexed with ``nodes`` completions run in parallel, no pod retries (the platform owns them).

    ``activeDeadlineSeconds`` = max_runtime (the Job fails DeadlineExceeded);
    multi-node pods get hostname ``<name>-<index>`` under subdomain ``<name>``
    (the headless Service), which MASTER_ADDR names. Checkpoints: read-write
    ``/checkpoints`` (``checkpoint_volume``). With ``metrics_port``, every pod
    declares it (container port ``metrics``, env CONTROLPLANE_METRICS_PORT,
    ``metrics_annotations``); rank 0 is the one that serves it
    (``examples/workload_metrics.py``), and the platform scrapes node 0's pod
    through the API server's pod proxy (``runner.KubernetesBackend.workload_exposition``).
    """
    env = _platform_env(w) + rendezvous_env(w)
    ports = [{"name": "rendezvous", "containerPort": w.master_port}] if w.nodes > 1 else []
    annotations = {}
    if w.metrics_port:
        env.append({"name": METRICS_PORT_ENV, "value": str(w.metrics_port)})
        ports.append({"name": METRICS_PORT_NAME, "containerPort": w.metrics_port})
        annotations = metrics_annotations(w)
    return _indexed_job(w, env, ports, annotations, subdomain=w.nodes > 1)


def _indexed_job(w: Workload, env: list[dict], ports: list[dict], annotations: dict, *, subdomain: bool) -> dict:
    """The Indexed batch/v1 Job of ``w``: ``nodes`` completions, all in parallel, ``backoffLimit`` 0 (a failed pod
    fails the Job: the platform owns retries), ``activeDeadlineSeconds`` = max runtime, pods pinned to
    ``node_names`` (``_scheduling``); with ``subdomain`` the pods are named ``<name>-<index>`` under the headless
    Service ``<name>`` (Kubernetes docs "DNS for Services and Pods", the Job's pod hostname rule). Every pod of the
    platform has ``enableServiceLinks: false``: the kubelet would otherwise put ``<SERVICE>_PORT``-style variables of
    every Service of the namespace in its environment (Kubernetes docs "Service", "Environment variables"), and the
    platform makes a Service per multi-node job and per serving job, so a busy team namespace would give every
    container thousands of variables (and one for each Service named like a variable the workload reads)."""
    template_meta: dict = {"labels": dict(w.labels)}
    if annotations:
        template_meta["annotations"] = annotations
    pod_spec = {"restartPolicy": "Never", "enableServiceLinks": False, "containers": [_container(w, env, ports)],
                "volumes": [checkpoint_volume(w)], **_scheduling(w)}
    if subdomain:
        pod_spec["subdomain"] = w.subdomain or w.name
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(w, owner=True),
        "spec": {
            "completions": w.nodes, "parallelism": w.nodes, "completionMode": "Indexed",
            "backoffLimit": 0, "activeDeadlineSeconds": int(w.max_runtime_seconds),
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def headless_service(w: Workload) -> dict:
    """The v1 Service (clusterIP None) giving each pod of a multi-node Job its DNS name, ready or not."""
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": _metadata(w),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": dict(w.labels),
                 "ports": [{"name": "rendezvous", "port": w.master_port, "targetPort": w.master_port}]},
    }


def replica_name(attempt_name: str, index: int) -> str:
    """The Deployment of replica ``index`` of a serving attempt: ``<attempt object name>-<index>`` (at most 44 + 4
    characters for up to 999 replicas; its pods' names, 17 more, are cut to 63 as their hostname by Kubernetes)."""
    return f"{attempt_name}-{index}"


def replica_workload(w: Workload, index: int) -> Workload:
    """Replica ``index`` of the serving ``w``: one pod (``nodes`` is 1 for a server) under the Deployment
    ``replica_name``, labelled with its index, pinned to the node admission booked for it (``node_names[k]`` where
    ``k`` is the index's place in ``w.slots``, which is the index itself until a slot lost with its node was
    released; none when the pool has no node rows, or the index is booked nowhere: any node the selectors
    allow)."""
    per = max(1, w.nodes)
    slots = w.slots
    at = slots.index(index) if index in slots else len(slots)
    nodes = w.node_names[at * per:(at + 1) * per]
    return dataclasses.replace(w, name=replica_name(w.name, index), replicas=1, node_names=nodes, replica=index)


def inference_deployment(w: Workload, index: int = 0) -> dict:
    """The apps/v1 Deployment of replica ``index`` of the serving ``w`` (``replica_workload``): one pod serving on
    ``port`` (env PORT), ready while GET ``health_path`` on that port answers 2xx or 3xx (an httpGet readiness
    probe): the Service sends requests to ready pods only, so a starting or failing replica gets none
    (Kubernetes "Configure Liveness, Readiness and Startup Probes").

    A Deployment per replica, not one of ``replicas`` pods: each replica's pod is pinned to the node admission
    booked for it, which one template for all cannot say, and a scale-down deletes the Deployments of exactly the
    released replicas, whose nodes the booking gave back (a Deployment scaled down picks the pods to delete by
    its own ranking, ``controller.kubernetes.io/pod-deletion-cost`` only a hint). A lost pod (evicted, deleted,
    its node drained) is replaced by its Deployment on the same node. ``strategy: Recreate``: when a rollout
    changes the template (another checkpoint), the old pod goes before the new one is made on the same node, so no
    surge pod asks for GPUs the booking does not hold.

    Checkpoints: ``/checkpoints`` read-only (``checkpoint_volume``), the job named by ``checkpoint_job_id``, also
    in the pod template's ``CHECKPOINT_ANNOTATION``.
    """
    r = replica_workload(w, index)
    env = _platform_env(r) + [{"name": "PORT", "value": str(r.port)}]
    container = _container(r, env, [{"name": "http", "containerPort": r.port}], read_only_checkpoints=True)
    container["readinessProbe"] = {"httpGet": {"path": r.health_path, "port": r.port}, "periodSeconds": 5,
                                   "failureThreshold": 3}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _metadata(r, owner=True),
        "spec": {
            "replicas": 1, "selector": {"matchLabels": r.owner_selector}, "strategy": {"type": "Recreate"},
            "template": {"metadata": {"labels": dict(r.labels),
                                      "annotations": {CHECKPOINT_ANNOTATION: str(r.checkpoint_job_id or r.job_id)}},
                         "spec": {"enableServiceLinks": False, "containers": [container],
                                  "volumes": [checkpoint_volume(r, read_only=True)],
                                  **_scheduling(r)}},
        },
    }


def serving_service_name(job_id: int) -> str:
    """The name of a serving job's Service: ``job-<job id>``, the job's and not an attempt's (an attempt's objects
    are ``job-<job id>-<number>-<uid>``), so its address is the job's for its life."""
    return f"job-{job_id}"


def serving_endpoint(w: Workload) -> str:
    """The in-cluster URL of the serving ``w``'s job: ``http://job-<job id>.<namespace>.svc:<port>``."""
    return f"http://{serving_service_name(w.job_id)}.{w.namespace}.svc:{w.port}"


def serving_selector(w: Workload) -> dict[str, str]:
    """The pods a serving job's Service sends requests to: every pod of the job (``LABEL_JOB``) of this
    installation, whatever its attempt, so the pods of the attempt that replaces one after a recovery are behind
    the same address without changing the Service."""
    selector = {LABEL_JOB: str(w.job_id)}
    if w.installation:
        selector[LABEL_INSTALLATION] = w.installation
    return selector


def inference_service(w: Workload) -> dict:
    """The serving job's v1 Service on ``port``, named for the job (``serving_service_name``), created by its first
    attempt's dispatch and kept across its attempts until the job ends: its endpoint. Its EndpointSlices list the
    ready pods only (the readiness probe), and kube-proxy balances connections over them. Its type is
    ``service_type`` (``ClusterIP``: in the cluster; ``NodePort`` or ``LoadBalancer`` to reach it from outside).
    Labels: team, job, installation and ``LABEL_ENDPOINT``; no attempt's, so no attempt's deletion takes it."""
    labels = {LABEL_TEAM: w.team, LABEL_JOB: str(w.job_id), LABEL_ENDPOINT: "true"}
    if w.installation:
        labels[LABEL_INSTALLATION] = w.installation
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": serving_service_name(w.job_id), "namespace": w.namespace, "labels": labels},
        "spec": {"type": w.service_type, "selector": serving_selector(w),
                 "ports": [{"name": "http", "port": w.port, "targetPort": w.port}]},
    }


# --- multi-role attempts (docs/adr/0039-multi-role-jobs.md) -----------------------------------------------------

#: The container port name of a role's own port (env PORT), on its pods and its headless Service.
ROLE_PORT_NAME = "serve"


def role_object_name(attempt_name: str, role: str) -> str:
    """The name of role ``role``'s Job and headless Service: ``<attempt object name>-<role>``. A role name is a
    DNS-1123 label of at most 12 characters and an attempt's name ``job-<job id>-<number>-<8 hex digits>``, so
    the pods' hostnames stay DNS labels (63 characters at most) for any job id (a bigint: 19 digits at most) and
    attempt number below 1,000: ``<name>-<pod index>``, or in a JobSet ``<name>-0-<pod index>``, is at most
    14 + 19 + 3 + 1 + 12 + 2 + 4 = 55 characters for up to 999 pods a role."""
    return f"{attempt_name}-{role}"


def role_job_name(w: Workload, role: str) -> str:
    """The name of the Job of ``role``: ``role_object_name``; in a JobSet its one child Job, which the JobSet
    controller names ``<jobset>-<replicated job>-<job index>`` (JobSet docs, "JobSet with network"): ``-0``."""
    name = role_object_name(w.name, role)
    return f"{name}-0" if w.jobset else name


def role_service_name(w: Workload, role: str) -> str:
    """The headless Service the pods of ``role`` are named under: the role's own (``role_object_name``); in a
    JobSet the one the JobSet controller makes for all roles, named by ``spec.network.subdomain`` (the attempt's
    name)."""
    return w.name if w.jobset else role_object_name(w.name, role)


def role_workload(w: Workload, role: Role) -> Workload:
    """The workload of one role of the multi-role ``w``: the role's image, command, env, pods, resources and nodes
    under its Job's name (``role_job_name``) and Service (``role_service_name``), labelled with the role."""
    return dataclasses.replace(
        w, name=role_job_name(w, role.name), subdomain=role_service_name(w, role.name), kind="training",
        image=role.image, command=role.command, args=role.args, env=role.env, nodes=role.pods,
        gpus_per_node=role.gpus_per_node, cpu=role.cpu, memory_gib=role.memory_gib, node_names=role.node_names,
        port=role.port or 0, metrics_port=0, role=role.name, roles=(), jobset=False)


def pod_dns_name(w: Workload, role: Role, index: int) -> str:
    """The stable DNS name of pod ``index`` of ``role``: ``<job>-<index>.<service>.<namespace>.svc`` (an Indexed
    Job's pod has hostname ``<job>-<index>`` and its headless Service as subdomain, Kubernetes docs "DNS for
    Services and Pods"; in a JobSet ``<jobset>-<role>-0-<index>.<jobset>``). It resolves once the pod exists,
    ready or not (``publishNotReadyAddresses``)."""
    return f"{role_job_name(w, role.name)}-{index}.{role_service_name(w, role.name)}.{w.namespace}.svc"


def role_addresses_variable(name: str) -> str:
    """``CONTROLPLANE_ROLE_<NAME>_ADDRESSES`` of role ``name`` (upper-cased, ``-`` as ``_``), as the local runner
    names it (``runners.local.runner.role_addresses_variable``)."""
    return f"CONTROLPLANE_ROLE_{name.upper().replace('-', '_')}_ADDRESSES"


def role_env(w: Workload, role: Role) -> list[dict]:
    """The role variables of ``role``'s pods, the contract the local runner gives (ADR 0039):
    ``CONTROLPLANE_ROLE``, ``CONTROLPLANE_ROLE_INDEX`` (the pod's completion index, by the downward API, as
    JOB_COMPLETION_INDEX), ``CONTROLPLANE_ROLES`` (every role, in name order, comma-separated),
    ``CONTROLPLANE_ROLE_<R>_ADDRESSES`` of every role that declares a port (``host:port`` of each of its pods in
    index order, ``pod_dns_name``) and, for a role with a port, ``PORT``."""
    index = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}
    env = [{"name": "CONTROLPLANE_ROLE", "value": role.name}, {"name": "CONTROLPLANE_ROLE_INDEX", "valueFrom": index},
           {"name": "CONTROLPLANE_ROLES", "value": ",".join(r.name for r in w.roles)}]
    for other in w.roles:
        if other.port is not None:
            env.append({"name": role_addresses_variable(other.name),
                        "value": ",".join(f"{pod_dns_name(w, other, i)}:{other.port}" for i in range(other.pods))})
    if role.port is not None:
        env.append({"name": "PORT", "value": str(role.port)})
    return env


def _role_ports(rw: Workload, role: Role) -> list[dict]:
    """The rendezvous port (``MASTER_PORT``) and the role's own, unless it is the same number."""
    ports = [{"name": "rendezvous", "containerPort": rw.master_port}]
    if role.port is not None and role.port != rw.master_port:
        ports.append({"name": ROLE_PORT_NAME, "containerPort": role.port})
    return ports


def role_job(w: Workload, role: Role) -> dict:
    """``role``'s Indexed batch/v1 Job: completions = parallelism = its pods, backoffLimit 0, each pod pinned to
    the nodes admission booked for the role, its own image, command, args, env and resources, the role
    variables (``role_env``) and its own rendezvous (``rendezvous_env``: MASTER_ADDR its pod 0, WORLD_SIZE its
    pods, RANK its index); pods named ``<job>-<index>`` under its headless Service (``role_service``). The Job
    says whether the attempt waits for the role (``COMPLETION_ANNOTATION``)."""
    rw = role_workload(w, role)
    env = _platform_env(rw) + role_env(w, role) + rendezvous_env(rw)
    job = _indexed_job(rw, env, _role_ports(rw, role), {}, subdomain=True)
    job["metadata"].setdefault("annotations", {})[COMPLETION_ANNOTATION] = "true" if role.completion else "false"
    return job


def role_service(w: Workload, role: Role) -> dict:
    """``role``'s headless v1 Service (clusterIP None, not-ready addresses published) selecting that role's pods
    alone: it gives each of them its DNS name (``pod_dns_name``)."""
    rw = role_workload(w, role)
    ports = [{"name": p["name"], "port": p["containerPort"], "targetPort": p["containerPort"]}
             for p in _role_ports(rw, role)]
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(rw),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": dict(rw.labels),
                     "ports": ports}}


# JobSet (kubernetes-sigs/jobset): one object whose controller makes a child Job per replicated Job and one
# headless Service for them all.
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"


def jobset(w: Workload) -> dict:
    """The multi-role ``w`` (with ``jobset``) as one ``jobset.x-k8s.io/v1alpha2`` JobSet named after the attempt: a
    replicated Job per role (1 replica, its template the role's Job: ``role_job``, labels and annotations
    included, which the JobSet controller copies to the child Job), ``network.enableDNSHostnames`` with the
    attempt's name as subdomain (the controller makes that headless Service; not-ready addresses published),
    ``failurePolicy.maxRestarts`` 0 (the platform owns retries: a failed child Job fails the JobSet) and a
    ``successPolicy`` of ``All`` the roles with completion (the JobSet completes when they have, and the
    controller then deletes the servers' Jobs). Field names and defaults: JobSet API reference (v1alpha2) and
    its "JobSet with network" example."""
    replicated = []
    for role in w.roles:
        job = role_job(w, role)
        meta = {k: v for k, v in job["metadata"].items() if k in ("labels", "annotations")}
        replicated.append({"name": role.name, "replicas": 1, "template": {"metadata": meta, "spec": job["spec"]}})
    waited = [r.name for r in w.roles if r.completion]
    return {"apiVersion": JOBSET_API_VERSION, "kind": "JobSet", "metadata": _metadata(w, owner=True),
            "spec": {"network": {"enableDNSHostnames": True, "subdomain": w.name, "publishNotReadyAddresses": True},
                     "failurePolicy": {"maxRestarts": 0},
                     "successPolicy": {"operator": "All", "targetReplicatedJobs": waited},
                     "replicatedJobs": replicated}}


def manifests(w: Workload) -> list[dict]:
    """Every object of the attempt in creation order (Services first, so DNS exists when pods start)."""
    if w.kind == "multi-role" and w.jobset:
        return [jobset(w)]
    if w.kind == "multi-role":
        return [role_service(w, r) for r in w.roles] + [role_job(w, r) for r in w.roles]
    if w.kind == "inference":
        return [inference_service(w)] + [inference_deployment(w, i) for i in w.slots]
    if w.nodes > 1:
        return [headless_service(w), training_job(w)]
    return [training_job(w)]
