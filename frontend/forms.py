"""Web UI forms: job submission (validated as the API validates it), quota and budget edits, cost queries,
notification subscriptions.

The submission form only collects text; every rule lives in ``jobs.spec`` so the UI and the API answer alike, and
its choices, defaults, limits and help come from the models there (``jobs.spec.field_schema``).
"""

from __future__ import annotations

import datetime as dt
import shlex
from decimal import Decimal

from django import forms
from django.utils import timezone
from rest_framework.exceptions import ParseError

from core.limits import THRESHOLD_MAX_PERCENT, threshold_out_of_range
from core.parsers import load_yaml
from costs.capacity import GROUPS as CAPACITY_GROUPS
from costs.capacity import MAX_WINDOW_DAYS
from costs.reports.build import period_errors
from jobs.spec import field_schema
from notifications.models import Event as NotificationEvent
from notifications.models import Subscription
from notifications.rules import subscription_errors
from quotas.models import GPU_QUOTA_FIELDS, VCPU_QUOTA_FIELDS, Budget, Quota
from runners.models import CPU_ACCELERATOR, Accelerator

# Error paths of a submission (``jobs.spec.error_paths``) -> the form field that shows them.
ERROR_FIELDS = {
    "team": "team",
    "name": "name",
    "kind": "kind",
    "spec.image": "image",
    "spec.command": "command",
    "spec.resources.accelerator": "accelerator",
    "spec.resources.gpus_per_node": "gpus_per_node",
    "spec.resources.nodes": "nodes",
    "spec.resources.cpu": "cpu",
    "spec.resources.memory_gib": "memory_gib",
    "spec.max_runtime_seconds": "max_runtime_seconds",
    "spec.priority": "priority",
    "spec.preemptible": "preemptible",
}
GROUP_BY_CHOICES = [("day", "Day"), ("team", "Team"), ("cluster", "Cluster"), ("accelerator", "Accelerator"),
                    ("job", "Job")]


def _number(text: str):
    """``"8"`` -> 8; anything else is passed on unchanged, so the serializer reports it."""
    text = (text or "").strip()
    return int(text) if text.isdigit() else text


def _quantity(text: str):
    """``"4"`` -> 4, ``"0.5"`` -> 0.5; anything else is passed on unchanged, so the serializer reports it."""
    text = (text or "").strip()
    try:
        return int(text) if text.isdigit() else float(text)
    except ValueError:
        return text


def _initial(path: str):
    """The form's opening value of the submission field at ``path``: its default, else its example."""
    schema = field_schema(path)
    value = schema.get("default", schema.get("example", ""))
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _help(path: str) -> str:
    """The description of the submission field at ``path``, as help text."""
    text = field_schema(path).get("description", "")
    return text[:1].upper() + text[1:] + "."


#: A command the form's help and its error for an empty Command box give as the example.
COMMAND_EXAMPLE = "python train.py --steps 10"
#: The error for an empty Command box.
EMPTY_COMMAND = f"Type the command the job runs, as you would in a shell, e.g. {COMMAND_EXAMPLE}."


class SubmitJobForm(forms.Form):
    """A job submission as form fields, or as a whole YAML document (``examples/jobs/*.yaml``) that wins when given.

    ``submission()`` builds the dict given to ``jobs.spec.validated_submission``;
    ``add_serializer_errors`` puts its dotted-path errors next to the fields.
    """

    team = forms.ChoiceField(required=False)
    name = forms.CharField(required=False, max_length=field_schema("name")["maxLength"],
                           help_text="Lowercase letters, digits and '-'.")
    kind = forms.ChoiceField(choices=[(k, k) for k in field_schema("kind")["enum"]], required=False,
                             initial=_initial("kind"))
    image = forms.CharField(required=False, max_length=field_schema("spec.image")["maxLength"],
                            initial=_initial("spec.image"))
    command = forms.CharField(required=False, max_length=4000, help_text=f"Shell words, e.g. {COMMAND_EXAMPLE}")
    accelerator = forms.ChoiceField(required=False)
    gpus_per_node = forms.CharField(required=False, initial=_initial("spec.resources.gpus_per_node"),
                                    label="GPUs per node")
    nodes = forms.CharField(required=False, initial=_initial("spec.resources.nodes"))
    cpu = forms.CharField(required=False, label="CPU cores per node",
                          help_text="Optional; required for a CPU-only job (accelerator CPU, 0 GPUs per node).")
    memory_gib = forms.CharField(required=False, label="Memory per node (GiB)", help_text="Optional.")
    # Opens empty: a serving job without one runs until cancelled; a training job must give one.
    max_runtime_seconds = forms.CharField(
        required=False, initial=_initial("spec.max_runtime_seconds"), label="Max runtime (seconds)",
        help_text=_help("spec.max_runtime_seconds"),
        widget=forms.TextInput(attrs={"placeholder": "e.g. 3600; required for training, empty for serving: no limit"}))
    priority = forms.ChoiceField(required=False, initial=_initial("spec.priority"))
    preemptible = forms.BooleanField(required=False, initial=_initial("spec.preemptible"),
                                     help_text=_help("spec.preemptible"))
    spec_yaml = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false"}),
                                label="Or the whole submission as YAML",
                                help_text="team, name, kind and spec, as in examples/jobs; replaces the fields above.")

    def __init__(self, *args, teams=(), priorities=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [(t.slug, t.slug) for t in teams]
        # Accelerators some node pool offers come first (GPU ones before CPU, since the form opens with GPUs per
        # node 1) and the first of them is the default, so a preview of the form as it opens can succeed; the
        # others stay choosable, marked.
        offered = set(Accelerator.objects.filter(node_pools__nodes__gt=0).values_list("name", flat=True))
        names = sorted(Accelerator.objects.values_list("name", flat=True),
                       key=lambda n: (n not in offered, n == CPU_ACCELERATOR, n))
        self.fields["accelerator"].choices = [
            (n, (f"{n} (CPU-only: 0 GPUs per node, give CPU cores)" if n == CPU_ACCELERATOR else n)
             if n in offered else f"{n} (no node pool offers it)") for n in names]
        if names and not self.is_bound:
            self.initial.setdefault("accelerator", names[0])
        self.fields["priority"].choices = [(p, p) for p in priorities]

    def submission(self) -> dict | None:
        """The submission dict; None (with an error on ``spec_yaml``) when the YAML does not parse to a mapping."""
        data = self.cleaned_data
        if data.get("spec_yaml", "").strip():
            try:
                # The API's loader and limits: size cap, safe, without aliases (they expand exponentially).
                parsed = load_yaml(data["spec_yaml"])
            except ParseError as exc:
                self.add_error("spec_yaml", str(exc.detail))
                return None
            if not isinstance(parsed, dict):
                self.add_error("spec_yaml", "the YAML must be a mapping with team, name, kind and spec")
                return None
            return parsed
        try:
            command = shlex.split(data.get("command") or "")
        except ValueError as exc:
            self.add_error("command", f"cannot split into words: {exc}")
            return None
        return {
            "team": data.get("team") or "",
            "name": data.get("name") or "",
            "kind": data.get("kind") or _initial("kind"),
            "spec": {
                "image": data.get("image") or "",
                "command": command,
                "resources": {"accelerator": data.get("accelerator") or "",
                              "gpus_per_node": _number(data.get("gpus_per_node")),
                              "nodes": _number(data.get("nodes")),
                              **{k: _quantity(data[k]) for k in ("cpu", "memory_gib") if (data.get(k) or "").strip()}},
                **({"max_runtime_seconds": _number(data["max_runtime_seconds"])}
                   if (data.get("max_runtime_seconds") or "").strip() else {}),  # empty: none (serving only)
                "priority": data.get("priority") or _initial("spec.priority"),
                "preemptible": bool(data.get("preemptible")),
            },
        }

    def add_serializer_errors(self, errors: dict[str, list[str]]) -> None:
        """Show serializer errors (flat dotted paths) on their fields; YAML mode or unknown paths go to ``spec_yaml``
        (prefixed with the path) or to the form's non-field errors."""
        yaml_mode = bool(self.cleaned_data.get("spec_yaml", "").strip())
        for path, messages in errors.items():
            field = None if yaml_mode else ERROR_FIELDS.get(path)
            if field == "command" and not (self.cleaned_data.get("command") or "").strip():
                messages = [EMPTY_COMMAND]  # the box was left empty: say what to type, not the API's list rule
            for message in messages:
                if field is not None:
                    self.add_error(field, message)
                elif yaml_mode:
                    self.add_error("spec_yaml", f"{path}: {message}")
                else:
                    self.add_error(None, f"{path}: {message}")


class ReasonForm(forms.ModelForm):
    """A staff edit form with the change's reason, which the audit record keeps (ADR 0031); optional."""

    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}),
                             help_text="Why: kept in the audit trail with the change.")


class QuotaForm(ReasonForm):
    """A team's quota for one accelerator: nominal, borrowing limit, lending limit and per-job cap, in GPUs; for a
    CPU quota (the CPU accelerator's row) the same four in vCPUs. The API's rules apply (``Quota.clean``: a
    lending limit at most nominal, numbers of one unit)."""

    class Meta:
        model = Quota
        fields = [*GPU_QUOTA_FIELDS, *VCPU_QUOTA_FIELDS]
        labels = {"nominal_gpus": "Nominal GPUs", "borrowing_limit_gpus": "Borrowing limit (GPUs)",
                  "lending_limit_gpus": "Lending limit (GPUs, empty: all)", "max_gpus_per_job": "Max GPUs per job (0: no cap)",
                  "nominal_vcpus": "Nominal vCPUs", "borrowing_limit_vcpus": "Borrowing limit (vCPUs)",
                  "lending_limit_vcpus": "Lending limit (vCPUs, empty: all)",
                  "max_vcpus_per_job": "Max vCPUs per job (0: no cap)"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in (GPU_QUOTA_FIELDS if self.instance.is_cpu else VCPU_QUOTA_FIELDS):
            del self.fields[name]  # a quota counts one unit


class BudgetForm(ReasonForm):
    """A team's budget: period, amount (USD), alert thresholds (percent, comma separated), action at 100 %."""

    alert_thresholds = forms.CharField(required=False, help_text="Percent of the amount, comma separated, e.g. 50, 80, 100")

    class Meta:
        model = Budget
        fields = ["period", "starts_at", "ends_at", "amount_usd", "alert_thresholds", "action", "stop_running"]
        labels = {"amount_usd": "Amount (USD)", "starts_at": "Starts at (custom period, UTC)",
                  "ends_at": "Ends at (custom period, UTC)"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk and not self.is_bound:
            self.initial["alert_thresholds"] = ", ".join(str(t) for t in self.instance.alert_thresholds)

    def clean_amount_usd(self):
        amount = self.cleaned_data.get("amount_usd")
        if amount is not None and amount <= 0:  # the API's rule (BudgetSerializer)
            raise forms.ValidationError("Must be greater than 0.")
        return amount

    def clean_alert_thresholds(self) -> list[int]:
        text = self.cleaned_data.get("alert_thresholds") or ""
        try:
            values = sorted({int(part) for part in text.replace(" ", "").split(",") if part})
        except ValueError:
            raise forms.ValidationError("whole percents separated by commas, e.g. 50, 80, 100") from None
        if any(threshold_out_of_range(v) for v in values):  # the API's rule (ThresholdListField)
            raise forms.ValidationError(f"thresholds must lie in (0, {THRESHOLD_MAX_PERCENT}] %")
        return values

    def clean(self):
        data = super().clean()
        if data.get("period") == Budget.Period.CUSTOM:
            start, end = data.get("starts_at"), data.get("ends_at")
            if not start or not end or end <= start:
                raise forms.ValidationError("a custom period needs a start before its end")
        return data


class ReasonMixin(forms.Form):
    """A change request's ``reason``: why the team needs the change (shown to staff, who decide)."""

    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=2000,
                             help_text="Why the team needs the change; platform staff decide and you are mailed the "
                                       "decision.")


class QuotaRequestForm(ReasonMixin, QuotaForm):
    """A team admin's request for new numbers of one quota: the quota's fields and a reason (ADR 0029)."""


class BudgetRequestForm(ReasonMixin, BudgetForm):
    """A team admin's request for a budget change, or a new budget: the budget's fields and a reason (ADR 0029)."""


def requested_values(form: forms.ModelForm, before: dict) -> dict:
    """The JSON values of a valid request form's model fields that differ from ``before`` (the object's values,
    empty for a new object): Decimals as text, datetimes in ISO 8601."""
    values = {}
    for name in form.Meta.fields:
        if name not in form.fields:
            continue
        value = form.cleaned_data.get(name)
        if name in before and before[name] == value:
            continue
        if isinstance(value, Decimal):
            value = str(value)
        elif isinstance(value, dt.datetime):
            value = value.isoformat()
        values[name] = value
    return values


def utc_days(first: dt.date, last: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """The UTC days ``first`` to ``last`` (inclusive) as the window ``[first 00:00 UTC, last + 1 day 00:00 UTC)``."""
    start = dt.datetime.combine(first, dt.time(), tzinfo=dt.timezone.utc)
    return start, dt.datetime.combine(last + dt.timedelta(days=1), dt.time(), tzinfo=dt.timezone.utc)


class CostQueryForm(forms.Form):
    """Costs page query: group by, the UTC days ``[start, end]`` (end inclusive), optionally one team (slug)."""

    group_by = forms.ChoiceField(choices=GROUP_BY_CHOICES, required=False, initial="day", label="Group by")
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), label="From (UTC day)",
                            error_messages={"invalid": "Enter a date as YYYY-MM-DD, e.g. 2026-11-01."})
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), label="To (UTC day, inclusive)",
                          error_messages={"invalid": "Enter a date as YYYY-MM-DD, e.g. 2026-11-30."})
    team = forms.ChoiceField(required=False)

    def __init__(self, *args, teams=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [("", "All my teams"), *((t.slug, t.slug) for t in teams)]

    def clean(self):
        data = super().clean()
        today = timezone.now().astimezone(dt.timezone.utc).date()
        data["group_by"] = data.get("group_by") or "day"
        data["end"] = data.get("end") or today
        if data["end"] >= dt.date.max:  # the window ends the day after: it must exist
            self.add_error("end", f"the end day must be before {dt.date.max.isoformat()}")
            return data
        data["start"] = data.get("start") or max(data["end"], dt.date.min + dt.timedelta(days=29)) - dt.timedelta(days=29)
        if data["end"] < data["start"]:
            # On the field, next to it: a form-wide error above the row of fields broke the row's layout.
            self.add_error("end", f"the end day ({data['end'].isoformat()}) is before the start day "
                                  f"({data['start'].isoformat()})")
        return data

    def window(self) -> tuple[dt.datetime, dt.datetime]:
        """``[start 00:00 UTC, end + 1 day 00:00 UTC)`` of the cleaned days."""
        return utc_days(self.cleaned_data["start"], self.cleaned_data["end"])


class CapacityQueryForm(forms.Form):
    """Capacity page query: group by (cluster, node pool, node, accelerator, UTC day or team) and the UTC days
    ``[start, end]`` (end inclusive; default the last 7 days, at most ``MAX_WINDOW_DAYS``)."""

    group_by = forms.ChoiceField(choices=[(g, g.replace("_", " ")) for g in CAPACITY_GROUPS], required=False,
                                 initial="cluster", label="Group by")
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), label="From (UTC day)",
                            error_messages={"invalid": "Enter a date as YYYY-MM-DD, e.g. 2026-11-01."})
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), label="To (UTC day, inclusive)",
                          error_messages={"invalid": "Enter a date as YYYY-MM-DD, e.g. 2026-11-30."})

    def clean(self):
        data = super().clean()
        data["group_by"] = data.get("group_by") or "cluster"
        end = data.get("end") or timezone.now().astimezone(dt.timezone.utc).date()
        if end >= dt.date.max:
            self.add_error("end", f"the end day must be before {dt.date.max.isoformat()}")
            return data
        start = data.get("start") or end - dt.timedelta(days=6)
        data["start"], data["end"] = start, end
        if end < start:
            self.add_error("end", f"the end day ({end.isoformat()}) is before the start day ({start.isoformat()})")
        elif (end - start).days + 1 > MAX_WINDOW_DAYS:
            self.add_error("start", f"the page covers at most {MAX_WINDOW_DAYS} days")
        return data

    def window(self) -> tuple[dt.datetime, dt.datetime]:
        """``[start 00:00 UTC, end + 1 day 00:00 UTC)`` of the cleaned days."""
        return utc_days(self.cleaned_data["start"], self.cleaned_data["end"])


PLATFORM_SCOPE = "__platform__"  # the team choice of a platform-wide report (no team slug can hold "_")


class ReportRequestForm(forms.Form):
    """A report built on demand: a team of the user's (or, for staff, the platform) over the UTC days ``[start,
    end]`` (end inclusive, as on the costs page). Period rules are the API's (``costs.reports.build.period_errors``:
    the end not before the start, at most ``REPORTS_MAX_PERIOD_DAYS`` days); their errors go on ``end``."""

    team = forms.ChoiceField(label="Team")
    start = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), label="From (UTC day)",
                            error_messages={"invalid": "Enter a date as YYYY-MM-DD, e.g. 2026-11-01."})
    end = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), label="To (UTC day, inclusive)",
                          error_messages={"invalid": "Enter a date as YYYY-MM-DD, e.g. 2026-11-30."})

    def __init__(self, *args, teams=(), staff: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        choices = [(t.slug, t.slug) for t in teams]
        if staff:
            choices.append((PLATFORM_SCOPE, "The platform (every team)"))
        self.fields["team"].choices = choices
        self.teams = {t.slug: t for t in teams}

    def clean(self):
        data = super().clean()
        if "start" in data and "end" in data:
            if data["end"] >= dt.date.max:
                self.add_error("end", f"the end day must be before {dt.date.max.isoformat()}")
                return data
            if data["end"] < data["start"]:
                self.add_error("end", f"the end day ({data['end'].isoformat()}) is before the start day "
                                      f"({data['start'].isoformat()})")
                return data
            for name, reason in period_errors(*self.window()).items():
                self.add_error(name, reason)
        return data

    def window(self) -> tuple[dt.datetime, dt.datetime]:
        """``[start 00:00 UTC, end + 1 day 00:00 UTC)`` of the chosen days."""
        return utc_days(self.cleaned_data["start"], self.cleaned_data["end"])

    def chosen_team(self):
        """The chosen Team, or None for the platform."""
        return self.teams.get(self.cleaned_data["team"])


class SubscriptionForm(forms.Form):
    """A notification subscription: yours or one of the teams you administer (``teams``: the Team rows offered),
    a channel with its address or URL and secret, the events. The rules are ``notifications.rules``, the API's."""

    team = forms.ChoiceField(label="For", required=False)
    channel = forms.ChoiceField(choices=Subscription.Channel.choices)
    email = forms.EmailField(required=False, help_text="E-mail: blank sends to your own address (yours only)")
    webhook_url = forms.CharField(required=False, max_length=2000, label="Webhook URL",
                                  help_text="http(s); receives Slack-compatible JSON")
    secret = forms.CharField(required=False, max_length=200, strip=False, widget=forms.PasswordInput,
                             help_text="Signs each POST: X-Controlplane-Signature-256 (HMAC-SHA256)")
    events = forms.MultipleChoiceField(choices=NotificationEvent.choices, widget=forms.CheckboxSelectMultiple)
    only_own_jobs = forms.BooleanField(required=False, label="Only jobs I submitted (mine only)")

    def __init__(self, *args, teams=(), owner_email: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.teams = {t.slug: t for t in teams}
        self.owner_email = owner_email
        self.fields["team"].choices = [("", "Me")] + [(slug, f"team {slug}") for slug in self.teams]

    def clean(self):
        data = super().clean()
        data["team"] = self.teams.get(data.get("team") or "")
        for field, message in subscription_errors(
                team=data["team"], channel=data.get("channel", ""), email=data.get("email", ""),
                webhook_url=data.get("webhook_url", ""), secret=data.get("secret", ""),
                only_own_jobs=data.get("only_own_jobs", False), owner_email=self.owner_email).items():
            self.add_error(field, message)
        return data
