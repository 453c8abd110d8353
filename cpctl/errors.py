"""``cpctl``'s exit codes and the error that ends a command with one (its lines go to stderr).

Their meaning, for users: ``cpctl.cli``'s docstring and ``cpctl --help``.
"""

from __future__ import annotations

import click

EXIT_OK = 0
EXIT_JOB_NOT_SUCCEEDED = 1  # submit --wait: the job ended other than SUCCEEDED
EXIT_BAD_INPUT = 2  # a 400, a bad command line (click's usage errors exit 2 too) or a bad file
EXIT_UNAUTHORIZED = 3  # 401
EXIT_FORBIDDEN = 4  # 403
EXIT_NOT_FOUND = 5  # 404
EXIT_CONFLICT = 6  # 409
EXIT_UNREACHABLE = 7  # connection refused, name not found, timeout
EXIT_UNEXPECTED = 8  # 5xx, an answer that is not JSON
EXIT_INTERRUPTED = 130  # Ctrl-C

EXIT_BY_STATUS = {400: EXIT_BAD_INPUT, 401: EXIT_UNAUTHORIZED, 403: EXIT_FORBIDDEN, 404: EXIT_NOT_FOUND,
                  409: EXIT_CONFLICT}


class CliError(click.ClickException):
    """A failure to report on stderr and end the command with.

    Args:
        exit_code: the process's exit code (one of the ``EXIT_*`` above).
        *lines: the messages, printed one per line on stderr, as given (no ``Error:`` prefix).
    """

    def __init__(self, exit_code: int, *lines: str):
        super().__init__(lines[0] if lines else "")
        self.exit_code = exit_code
        self.lines = lines

    def show(self, file=None) -> None:
        """Print each line on stderr (or ``file``)."""
        for line in self.lines:
            click.echo(line, file=file, err=file is None)
