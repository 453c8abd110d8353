"""Prometheus metrics of costs and budgets (prometheus_client), exposed with the others at ``/metrics``.

Names follow Prometheus conventions: ``_usd`` for money, ``_total`` for counters, ratios 0-1.
"""

from prometheus_client import Counter, Gauge

BUDGET_SPENT_USD = Gauge("controlplane_budget_spent_usd", "Ledger USD spent in the budget's current period",
                         ["team", "budget"])
BUDGET_AMOUNT_USD = Gauge("controlplane_budget_amount_usd", "Budget amount of the current period, USD", ["team", "budget"])
BUDGET_FORECAST_USD = Gauge("controlplane_budget_forecast_usd", "Forecast USD at the end of the budget's period",
                            ["team", "budget"])
BUDGET_ALERTS = Counter("controlplane_budget_alerts_total", "Budget threshold alerts fired",
                        ["team", "budget", "threshold"])
LEDGER_DISCREPANCY_PERCENT = Gauge("controlplane_ledger_discrepancy_percent",
                                   "Relative difference of ledger and kube-state-metrics GPU-hours, percent", ["cluster"])
