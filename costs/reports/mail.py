"""Sending a stored report by e-mail through Django's mail: to its team's admins, or to staff when platform-wide."""

from __future__ import annotations

from email.mime.image import MIMEImage

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMultiAlternatives

from ..budgets import admin_emails
from ..models import Report
from .render import render_charts, render_html


def report_recipients(report: Report) -> list[str]:
    """Who gets ``report`` by e-mail: its team's admins; platform staff for a platform-wide report."""
    if report.team_id is not None:
        return admin_emails(report.team_id)
    return sorted(e for e in get_user_model().objects.filter(is_staff=True, is_active=True)
                  .values_list("email", flat=True) if e)


def send_report(report: Report) -> int:
    """E-mail ``report`` (HTML with PNG charts inline by ``cid:``, the CSV attached) through Django's mail.

    Returns the number of messages sent (0 when the scope has no recipient).
    """
    recipients = report_recipients(report)
    if not recipients:
        return 0
    charts = render_charts(report.data)
    html = render_html(report.data, {name: f"cid:{name}" for name in charts})
    totals = report.data["totals"]
    text = (f"{report}: {totals['gpu_hours']} GPU-hours, ${totals['cost_usd']}.\n"
            f"{report.data['utilization']['note']}\nThe full report is attached as CSV.\n")
    message = EmailMultiAlternatives(
        subject=f"[controlplane] {report.kind} report {report.scope_name} {report.period_start:%Y-%m-%d}",
        body=text, from_email=settings.DEFAULT_FROM_EMAIL, to=recipients,
    )
    message.attach_alternative(html, "text/html")
    for name, png in charts.items():
        image = MIMEImage(png, "png")
        image.add_header("Content-ID", f"<{name}>")
        image.add_header("Content-Disposition", "inline", filename=f"{name}.png")
        message.attach(image)
    message.attach(f"report-{report.scope_name}-{report.period_start:%Y%m%d}.csv", report.csv, "text/csv")
    return message.send()
