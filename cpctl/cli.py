"""``cpctl``: submit and follow jobs, read quotas, budgets and costs, through the control plane's REST API.

Run it as ``cpctl COMMAND ...`` (``make install`` puts it in ``.venv/bin``) or
``python -m cpctl COMMAND ...``; ``main`` is the click command group. It talks HTTP to ``/api/v1/`` only, so it needs
no database access: a URL and an API token.

Configuration (an option wins over the environment; ``--url``, ``--token``,
``--json`` and ``--timeout`` go before or after the command's name):

  --url URL      or CONTROLPLANE_URL     default http://127.0.0.1:8000
  --token=KEY    or CONTROLPLANE_TOKEN   sent as ``Authorization: Token KEY``; never printed
                                         (prefer the variable: options show in ``ps``)
  --timeout S                            seconds to wait for each answer, default 30

Commands (one module each under ``cpctl.commands``)::

  submit FILE [--team T] [--name N] [--wait]   YAML (application/yaml) or JSON (.json); "-" reads stdin;
                                               a document with array: (count or grid) submits a job array
  jobs [--team T] [--state S ...] [--limit N]  a table: id, team, name, state, GPUs, accelerator, cost, age;
                                               --kind K, --array ID (its elements)
  job ID                                       details, with why a queued job waits and its queue position
  events ID                                    the job's timeline
  efficiency ID                                the job's throughput (last, run), loss, MFU, tokens per attempt
  logs ID [--node N] [--tail N] [--follow]     the current attempt's log of one node
  cancel ID
  rollout ID --checkpoint-from-job N          a serving job to another training job's checkpoint, replica by replica
  arrays [--team T] [--limit N]                job arrays: status, elements, parallelism, counts, cost
  array ID | array cancel ID                   one array's status, counts, cost and grid; or cancel it all
  quotas [--team T]                            GPU quotas and CPU quotas (vCPUs)
  cohorts [--cohort ID]                        trees of cohorts: each level's quota, limits and usage
  fair-share                                   teams' decayed GPU-hours, weight and cohort share (queue order)
  clusters                                     clusters: health, since when and why, last contact, GPUs
  budgets [--team T]                           budgets' current period: spent, committed, remaining, forecast
  costs [--group-by team|cluster|accelerator|job|day] [--start S] [--end E] [--team T]
  utilization [--group-by ...] [--start S] [--end E] [--team T]
                                               average GPU utilization, coverage, idle GPU-hours and USD
  reports [--team T] [--kind daily|weekly|custom] [--limit N]   stored reports, newest first
  report ID [--csv]                            one report's figures, or its CSV (section,item,metric,value)
  build-report (--team T | --platform) --start S --end E
                                               a report of any period, built now (platform: staff)
  nodes [--cluster C] [--health H]             GPU nodes: health, whether they take work, the evidence
  cordon ID [--note N] | uncordon ID [--reason R] | clear-health ID [--reason R]
                                               staff: keep admission off a node, let it back, clear its health
  requests [--team T] [--state S]              quota and budget change requests
  request quota|budget --team T [--target ID] --set FIELD=VALUE ... --reason R
                                               a team admin asks staff for a change (ADR 0029)
  approve ID [--note N] | decline ID --note N  staff: apply a request, or refuse it with a reason
  withdraw ID                                  the requester takes back a pending request
  audit [--team T] [--type X] [--object-id N] [--actor U] [--action A] [--since S] [--until U] [--limit N]
                                               the audit trail: who changed what, when, before, after, why
  subscriptions                                your and your teams' notification subscriptions
  subscribe --event E ... [--team T] [--email A | --webhook URL [--secret K]] [--only-own-jobs]
                                               be told of job ends and budget thresholds (a team's: its admins)
  unsubscribe ID                               delete a subscription
  notifications [--status S] [--limit N]       the delivery log: sent, pending, failed, the last error

``--json`` (every command) prints the API's JSON instead of a table; list
commands print the API's page shape ``{"count", "next", "previous",
"results"}`` with every page fetched up to the limit. Tables are rich
tables: fitted to a terminal, plain text (no colour, nothing wrapped) when
piped.

Exit codes (``cpctl.errors``):

  0    success
  1    ``submit --wait``: the job ended in a state other than SUCCEEDED
  2    bad input: the API answered 400 (each field path and its reason are printed,
       one per line), or the command line or the file is wrong
  3    401: no token, or an unknown or expired one
  4    403: the token's user may not do this (e.g. cancel another member's job)
  5    404: no such object, or one of another team (the API does not tell them apart)
  6    409: conflict, e.g. cancelling a job that is already final
  7    the API cannot be reached (connection refused, name not found, timeout)
  8    any other unexpected answer (5xx, a 503 from an unreachable cluster, not JSON)
  130  interrupted (Ctrl-C); a followed job keeps running
"""

from __future__ import annotations

import os
import sys

import click

from cpctl.commands import arrays, audit, clusters, costs, jobs, nodes, notifications, quotas, reports, requests
from cpctl.errors import EXIT_INTERRUPTED, EXIT_OK
from cpctl.options import CONTEXT_SETTINGS, Connection, connection_params


class CpctlGroup(click.Group):
    """The command group: commands listed in the order they were added; Ctrl-C exits 130, a closed pipe 0."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """The commands' names, in the order they were added (jobs first, staff's node commands last)."""
        return list(self.commands)

    def invoke(self, ctx: click.Context):
        """Run the command; Ctrl-C (not caught by the command) exits 130, a reader gone away (``cpctl jobs |
        head``) exits 0 without a message."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            silence_stdout()
            raise click.exceptions.Exit(EXIT_OK) from None


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit after a broken pipe raises nothing (the recipe of
    Python's ``signal`` documentation, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor: nothing will be flushed to a pipe
        pass


def remember_connection(ctx: click.Context, url, token, as_json, timeout) -> None:
    """Keep the options given before the command's name for the command (which may override them)."""
    ctx.obj = Connection(url=url, token=token, json=as_json, timeout=timeout)


main = CpctlGroup(
    name="cpctl", callback=click.pass_context(remember_connection), params=connection_params(),
    context_settings=CONTEXT_SETTINGS,
    help="Submit and follow GPU jobs, read quotas, budgets, costs, utilization and reports, through the control "
         "plane's API.",
    epilog="Exit codes: 0 ok, 1 job did not succeed (--wait), 2 bad input (400), 3 unauthorized (401), "
           "4 forbidden (403), 5 not found (404), 6 conflict (409), 7 unreachable, 8 unexpected answer, "
           "130 interrupted.",
)
for _module in (jobs, arrays, quotas, clusters, costs, reports, nodes, requests, audit, notifications):
    for _command in _module.COMMANDS:
        main.add_command(_command)


if __name__ == "__main__":
    main(prog_name="cpctl")
