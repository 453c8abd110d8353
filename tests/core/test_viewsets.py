"""The scoped base viewsets (``core.viewsets``) cannot be used unscoped: a viewset without ``scope_queryset`` is
refused at request time, one overriding ``get_queryset`` when its class is made."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from rest_framework.test import APIRequestFactory

from core.viewsets import ScopedReadOnlyViewSet
from quotas.models import Team


def test_a_viewset_without_scope_queryset_is_refused(teammate):
    class Unscoped(ScopedReadOnlyViewSet):
        queryset = Team.objects.all()

    view = Unscoped()
    view.request = APIRequestFactory().get("/")
    view.request.user = teammate.user
    with pytest.raises(ImproperlyConfigured, match="scope_queryset"):
        view.get_queryset()


def test_overriding_get_queryset_is_refused():
    with pytest.raises(ImproperlyConfigured, match="dangerously_get_queryset"):
        class Bypass(ScopedReadOnlyViewSet):  # noqa: F841 - the class statement itself must fail
            queryset = Team.objects.all()

            def get_queryset(self):
                return Team.objects.all()
