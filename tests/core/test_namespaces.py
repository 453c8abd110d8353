"""A team's Kubernetes namespace: the prefix and the slug, a valid DNS label however long the prefix."""

from __future__ import annotations

from django.test import override_settings

from core.namespaces import team_namespace


def test_the_namespace_is_the_prefix_and_the_slug():
    with override_settings(K8S_NAMESPACE_PREFIX="cp-"):
        assert team_namespace("ml-research") == "cp-ml-research"


def test_a_long_name_is_cut_to_63_characters_without_a_trailing_dash():
    # 60 + len("ab-cd") = 65 characters: the cut keeps "ab-", and a DNS label cannot end with a dash.
    with override_settings(K8S_NAMESPACE_PREFIX="p" * 60):
        assert team_namespace("ab-cd") == "p" * 60 + "ab"
