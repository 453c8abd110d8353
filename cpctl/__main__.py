"""``python -m cpctl``: the command-line client (see ``cpctl.cli``); exits with the command's code."""

from cpctl.cli import main

main(prog_name="cpctl")
