"""``/api/v1/prices/``: the price catalog, read-only, filtered by provider, region, accelerator and capacity."""

from __future__ import annotations

from decimal import Decimal

from costs.models import Price
from costs.seed import CATALOG_EFFECTIVE_FROM


def test_prices_filter_by_provider_region_accelerator_and_capacity(outsider, catalog):
    params = {"provider": "aws", "region": "us-east-1", "accelerator": "H100-80GB", "capacity_type": "spot"}
    rows = outsider.client.get("/api/v1/prices/", params).json()["results"]
    expected = Price.objects.get(provider="aws", region="us-east-1", accelerator__name="H100-80GB",
                                 capacity_type="spot", effective_from=CATALOG_EFFECTIVE_FROM)
    assert [(r["id"], Decimal(r["usd_per_gpu_hour"])) for r in rows] == [(expected.pk, expected.usd_per_gpu_hour)]
    assert outsider.client.post("/api/v1/prices/", {}, format="json").status_code == 405
