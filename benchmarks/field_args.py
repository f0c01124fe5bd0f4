"""``FIELD=VALUE`` config overrides on a benchmark's command line (``learning.py --set``, ``vs_comlrl.py --ours``).

The value is read by the field's codec (``comlrl_lab.trainers.preference.config.fields``), as the CLI's ``--set``, a sweep
grid and the workbench read it; a mistake is argparse's one-line usage error.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from comlrl_lab.trainers.preference.config.fields import parse_assignment


def field_arg(config_class: type) -> Callable[[str], tuple[str, object]]:
    """An argparse ``type`` reading ``FIELD=VALUE`` for a field of ``config_class``."""

    def parse(text: str) -> tuple[str, object]:
        try:
            return parse_assignment(config_class, text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def add_set_argument(parser: argparse.ArgumentParser, config_class: type, help_text: str) -> None:
    """A repeatable ``--set FIELD=VALUE`` whose (name, value) pairs land in ``args.fields``."""
    parser.add_argument(
        "--set",
        dest="fields",
        action="append",
        type=field_arg(config_class),
        default=[],
        metavar="FIELD=VALUE",
        help=help_text,
    )
