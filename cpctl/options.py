"""The options every ``cpctl`` command takes (``--url``, ``--token``, ``--json``, ``--timeout``, before or after the
command's name), their checks, and ``api_command``, which turns a function of an ``Api`` into a click command."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Callable

import click

from cpctl.client import DEFAULT_URL, Client, check_connection_settings
from cpctl.output import print_json

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}
NEGATIVE_NUMBER = re.compile(r"-\d+")


class PositiveFloat(click.ParamType):
    """A finite number of seconds above zero and at most 1,000,000 (``inf`` would overflow the socket timeout)."""

    name = "seconds"

    def convert(self, value, param, ctx):
        """``value`` as a float; a usage error (exit 2) when it is not a number in (0, 1e6]."""
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not number > 0 or not math.isfinite(number) or number > 1e6:
            self.fail(f"must be above 0 and at most 1000000, not {value}", param, ctx)
        return number


POSITIVE_INT = click.IntRange(min=1)


@dataclass
class Connection:
    """The connection options given before the command's name (``cpctl --url U jobs``); None: not given."""

    url: str | None = None
    token: str | None = None
    json: bool = False
    timeout: float | None = None


def connection_params() -> list[click.Option]:
    """Fresh ``--url``, ``--token``, ``--json`` and ``--timeout`` options (for the group and for each command)."""
    return [
        click.Option(["--url"], default=None, metavar="URL",
                     help=f"the control plane's URL (env CONTROLPLANE_URL, default {DEFAULT_URL})"),
        click.Option(["--token"], default=None, metavar="KEY",
                     help="API token (env CONTROLPLANE_TOKEN; the variable keeps it out of ps)"),
        click.Option(["--json", "as_json"], is_flag=True, default=False,
                     help="print the API's JSON instead of a table"),
        click.Option(["--timeout"], type=PositiveFloat(), default=None,
                     help="seconds to wait for each answer (default 30)"),
    ]


@dataclass
class Api:
    """What a command works with: the API client and whether to print the API's JSON."""

    client: Client
    json: bool

    def shown_as_json(self, body) -> bool:
        """Print ``body`` (the API's answer) as JSON when ``--json`` was given; whether it was."""
        if self.json:
            print_json(body)
        return self.json


class ApiCommand(click.Command):
    """A command whose arguments may be negative numbers (``cpctl job -1`` asks the API, which answers 404),
    as no option of cpctl looks like one."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Parse ``args``, a bare negative number read as an argument rather than as an unknown option."""
        end = args.index("--") if "--" in args else len(args)
        takes_value = {name for param in self.params if isinstance(param, click.Option) and not param.is_flag
                       for name in param.opts}
        numbers, rest = [], []
        for index, arg in enumerate(args[:end]):
            is_value = index > 0 and args[index - 1] in takes_value
            (numbers if NEGATIVE_NUMBER.fullmatch(arg) and not is_value else rest).append(arg)
        if numbers:
            args = rest + ["--"] + numbers + args[end + 1:]
        return super().parse_args(ctx, args)


def api_command(name: str, help_text: str) -> Callable[[Callable[..., int]], click.Command]:
    """A decorator: ``fn(api: Api, **params) -> exit code`` as the click command ``name``.

    ``fn``'s own click arguments and options come first, then the connection
    options. An option given after the command's name wins over one given
    before it; then the environment (CONTROLPLANE_URL, CONTROLPLANE_TOKEN;
    an empty value counts as none), then the defaults. A bad URL or token is
    a CliError (exit 2) before any request.
    """

    def decorate(fn: Callable[..., int]) -> click.Command:
        own = list(reversed(getattr(fn, "__click_params__", [])))

        def callback(url, token, as_json, timeout, **params):
            ctx = click.get_current_context()
            before = ctx.find_object(Connection) or Connection()
            url = (url if url is not None else before.url) or os.environ.get("CONTROLPLANE_URL") or DEFAULT_URL
            token = (token if token is not None else before.token) or os.environ.get("CONTROLPLANE_TOKEN") or None
            check_connection_settings(url, token)
            client = Client(url, token, timeout=timeout or before.timeout or 30.0)
            ctx.call_on_close(client.close)
            code = fn(Api(client, as_json or before.json), **params)
            if code:
                ctx.exit(code)

        return ApiCommand(name, callback=callback, params=own + connection_params(), help=help_text,
                          short_help=help_text, context_settings=CONTEXT_SETTINGS)

    return decorate
