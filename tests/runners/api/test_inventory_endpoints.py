"""Accelerators, clusters and node pools: readable by every user, clusters writable by staff, no secrets shown."""

from __future__ import annotations

from decimal import Decimal

from runners.models import Cluster
from tests.support.factories import make_attempt, make_cluster, make_job
from tests.support.personas import signed_in

SECRET_WORDS = ("credential", "token", "kubeconfig", "secret", "password", "key")


def all_keys(value) -> set[str]:
    """Every dict key anywhere in a decoded JSON value."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in all_keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in all_keys(v)}
    return set()


def test_every_user_lists_accelerators(owner, teammate, outsider, catalog):
    for persona in (owner, teammate, outsider):
        names = [a["name"] for a in persona.client.get("/api/v1/accelerators/").json()["results"]]
        assert names == ["A100-80GB", "H100-80GB", "L4"]


def test_a_cluster_shows_pools_with_free_gpus_and_price_now(teammate, teams, aws_cluster, h100):
    job = make_job(teams[0], teammate.user, h100, gpus_per_node=4, nodes=1)
    make_attempt(job, aws_cluster["cluster"], aws_cluster["pool"])
    body = teammate.client.get(f"/api/v1/clusters/{aws_cluster['cluster'].pk}/").json()
    assert (body["name"], body["provider"], body["region"], body["emulated"], body["health"]) == (
        "aws-use1", "aws", "us-east-1", False, "healthy")
    (pool,) = body["node_pools"]
    assert (pool["accelerator"], pool["capacity_gpus"], pool["free_gpus"]) == ("H100-80GB", 16, 12)
    assert Decimal(pool["usd_per_gpu_hour"]) == Decimal("6.88")


def test_a_cluster_override_price_wins(teammate, h100, catalog):
    cluster, _ = make_cluster("cheap", "aws", "us-east-1", h100, price="5.00")
    pool = teammate.client.get(f"/api/v1/clusters/{cluster.pk}/").json()["node_pools"][0]
    assert Decimal(pool["usd_per_gpu_hour"]) == Decimal("5.00")


def test_an_unpriced_pool_shows_a_null_price(teammate, h100, catalog):
    cluster, _ = make_cluster("onprem-1", "onprem", "basement", h100)
    pool = teammate.client.get(f"/api/v1/clusters/{cluster.pk}/").json()["node_pools"][0]
    assert pool["usd_per_gpu_hour"] is None


def test_clusters_never_show_credentials(teammate, staff, aws_cluster):
    for persona in (teammate, staff):
        keys = all_keys(persona.client.get("/api/v1/clusters/").json())
        assert not [k for k in keys if any(word in k.lower() for word in SECRET_WORDS)], keys


def test_the_cluster_list_has_no_n_plus_one(teammate, h100, catalog, django_assert_max_num_queries):
    for i in range(5):
        make_cluster(f"c{i}", "aws", "us-east-1", h100)
    with django_assert_max_num_queries(10):
        r = teammate.client.get("/api/v1/clusters/")
    assert r.json()["count"] == 5


def test_staff_create_and_update_clusters(staff, catalog):
    r = staff.client.post("/api/v1/clusters/", {"name": "gcp-usc1", "provider": "gcp", "region": "us-central1",
                                                "backend": "kubernetes", "health": "unreachable"}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["health"] == "healthy"  # health belongs to the reconcile loop
    r = staff.client.patch(f"/api/v1/clusters/{r.json()['id']}/", {"region": "us-east4"}, format="json")
    assert r.status_code == 200
    assert Cluster.objects.get(name="gcp-usc1").region == "us-east4"


def test_users_cannot_write_clusters(owner, aws_cluster):
    r = owner.client.post("/api/v1/clusters/", {"name": "mine", "provider": "aws", "region": "x",
                                                "backend": "kubernetes"}, format="json")
    assert r.status_code == 403
    assert owner.client.patch(f"/api/v1/clusters/{aws_cluster['cluster'].pk}/", {"region": "x"},
                              format="json").status_code == 403
    assert owner.client.delete(f"/api/v1/clusters/{aws_cluster['cluster'].pk}/").status_code == 403  # staff only
    assert Cluster.objects.get(pk=aws_cluster["cluster"].pk).region == "us-east-1"


def test_node_pools_filter_by_cluster_and_accelerator(outsider, aws_cluster, h100, catalog):
    make_cluster("other", "gcp", "us-central1", catalog["L4"], gpus_per_node=4)
    body = outsider.client.get("/api/v1/node-pools/", {"accelerator": "L4"}).json()
    assert [(p["cluster"], p["gpus_per_node"]) for p in body["results"]] == [("other", 4)]
    assert outsider.client.get("/api/v1/node-pools/", {"cluster": "aws-use1"}).json()["count"] == 1


def test_a_cpu_node_pool_shows_its_prices_per_vcpu_and_gib_hour(teammate, catalog):
    from costs.seed import seed_cpu_prices
    from runners.models import cpu_flavor

    seed_cpu_prices()
    cluster, _ = make_cluster("gcp-cpu", "gcp", "us-central1", cpu_flavor(), nodes=3, gpus_per_node=0)
    pool = teammate.client.get(f"/api/v1/clusters/{cluster.pk}/").json()["node_pools"][0]
    assert (pool["accelerator"], pool["gpus_per_node"], pool["capacity_gpus"]) == ("CPU", 0, 0)
    assert [Decimal(pool[k]) for k in ("usd_per_gpu_hour", "usd_per_vcpu_hour", "usd_per_gib_hour")] == [
        Decimal(0), Decimal("0.031611"), Decimal("0.004237")]
    page = signed_in(teammate).get("/clusters/").content.decode()
    assert "$0.031611/vCPU-h + $0.004237/GiB-h" in page
