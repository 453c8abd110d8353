"""The REST API of teams, quotas, budgets, cohorts and priority classes."""
