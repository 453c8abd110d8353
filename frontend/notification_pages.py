"""The Notifications page: your and your teams' subscriptions, a form for a new one, and the delivery log
(docs/adr/0035-notifications.md). Who may make or delete which subscription is ``notifications.rules``."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from notifications.models import Notification, Subscription
from notifications.rules import may_change, refusal, shown_url
from quotas.models import Membership, Team

from .forms import SubscriptionForm

#: Notifications shown in the page's log, newest first.
LOG_ROWS = 50


def administered_teams(user):
    """The teams whose subscriptions ``user`` may make: those they administer, every team for staff."""
    teams = Team.objects.order_by("slug")
    if user.is_staff:
        return list(teams)
    return list(teams.filter(memberships__user=user, memberships__role=Membership.Role.ADMIN))


@login_required
@require_http_methods(["GET", "POST"])
def notification_list(request):
    """List the subscriptions the user sees (with a Delete for those they may change), the form for a new one
    (POST makes it: yours, or a team's you administer), and the last ``LOG_ROWS`` notifications."""
    form = SubscriptionForm(request.POST or None, teams=administered_teams(request.user),
                            owner_email=request.user.email)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        team = data["team"]
        sub = Subscription.objects.create(
            team=team, user=None if team else request.user, channel=data["channel"], email=data["email"],
            webhook_url=data["webhook_url"], secret=data["secret"], events=data["events"],
            only_own_jobs=data["only_own_jobs"], created_by=request.user)
        messages.success(request, f"Subscription {sub.pk} made.")
        return redirect("frontend:notification-list")
    subs = list(Subscription.objects.visible_to(request.user).select_related("team", "user"))
    rows = [{"sub": s, "sends_to": shown_url(s.webhook_url) if s.channel == "webhook" else
             (s.email or "your address"), "may_change": may_change(request.user, s)} for s in subs]
    log = Notification.objects.visible_to(request.user).select_related("team", "subscription")[:LOG_ROWS]
    return render(request, "frontend/notification_list.html", {"rows": rows, "form": form, "log": log},
                  status=400 if request.method == "POST" else 200)


@login_required
@require_POST
def subscription_delete(request, pk: int):
    """Delete a subscription: one the user cannot see is a 404, one they see but may not change a 403."""
    sub = get_object_or_404(Subscription.objects.visible_to(request.user), pk=pk)
    if not may_change(request.user, sub):
        raise PermissionDenied(refusal(sub))
    sub.delete()
    messages.success(request, f"Subscription {pk} deleted.")
    return redirect("frontend:notification-list")
