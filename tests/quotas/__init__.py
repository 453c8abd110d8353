"""Tests of the quotas app: teams, memberships, tokens, quotas, budgets and fair-share settings."""
