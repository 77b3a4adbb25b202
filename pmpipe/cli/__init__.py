"""The `pmpipe` command: run a stage, plan a campaign, write the schema, show or verify
stores, check this machine (doctor), collect or submit a campaign, benchmark. The
subcommands are the table of :mod:`pmpipe.cli.commands`."""

from __future__ import annotations

import argparse
import sys

from pmpipe.cli.arguments import Command
from pmpipe.cli.commands import COMMANDS
from pmpipe.runtime import log

LOG = log.get(__name__)
DEBUG = "show the traceback of an error (or PMPIPE_DEBUG=1)"


def _add(subparsers, command: Command) -> None:
    """The parser of ``command`` (and its subcommands) under ``subparsers``."""
    parser = subparsers.add_parser(command.name, help=command.help)
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG)
    for flags, options in command.args:
        parser.add_argument(*flags, **options)
    if command.handler is not None:
        parser.set_defaults(func=command.handler)
    if command.subcommands:
        nested = parser.add_subparsers(dest="target", required=True)
        for sub in command.subcommands:
            _add(nested, sub)


class _Version(argparse.Action):
    """``--version``: pmpipe's version and, from a checkout, its commit; then exit."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="show pmpipe's version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from pmpipe.runtime import versions
        from pmpipe.storage import provenance

        commit = provenance.git_commit()
        version = versions.installed("pmpipe") or "(not installed)"
        text = f"pmpipe {version}" + (f" (commit {commit})" if commit else "")
        sys.stdout.write(text + "\n")  # on stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand of the table."""
    parser = argparse.ArgumentParser(prog="pmpipe", description="Cosmological PM simulation suites")
    parser.add_argument("--version", action=_Version)
    parser.add_argument("--debug", action="store_true", help=DEBUG)
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        _add(commands, command)
    return parser


def main(argv=None) -> int:
    """Parse ``argv`` and run the command; a configuration or store error, or a JAX backend
    that cannot start, is one message on stderr and exit status 2 (with ``--debug`` or
    PMPIPE_DEBUG=1, the traceback instead)."""
    from pmpipe.run import config
    from pmpipe.runtime import backend
    from pmpipe.storage import disk, store

    args = build_parser().parse_args(argv)
    log.configure()
    debug = getattr(args, "debug", False) or log.debug_requested()
    try:
        return args.func(args)
    except (config.ConfigError, store.IncompleteStoreError, backend.BackendError) as err:
        if debug:
            raise
        LOG.error("error: %s", err)
        return 2
    except Exception as err:
        problem = None if debug else disk.known_failure(err)
        if problem is None:
            raise
        LOG.error("error: %s", problem)
        return 2
