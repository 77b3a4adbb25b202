"""What the table of ``pmpipe`` subcommands is made of: one argument (:func:`arg`), one
subcommand (:class:`Command`), and the arguments several subcommands share."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path


def arg(*flags: str, **options) -> tuple[tuple[str, ...], dict]:
    """One argument: argparse's flags and options."""
    return flags, options


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand: name, help, handler (None for a group of subcommands), arguments and
    subcommands."""

    name: str
    help: str
    handler: Callable | None = None
    args: tuple = ()
    subcommands: tuple[Command, ...] = ()


CAMPAIGN = arg("campaign", help="campaign file (YAML or JSON)")
RESULTS = arg("--results", type=Path, default=Path("results"), help="results folder")
JSON = arg("--json", metavar="PATH", help="also write the record to PATH")
PARTICLES = arg("--particles", type=int, required=True, help="particles per side, N")
OVERSAMPLE = arg("--oversample", type=int, default=1, help="force mesh / particle grid, B")
STEPS = arg("--steps", type=int, default=10, help="PM steps from a=0.1 to a=1")
PROFILE = arg(
    "--profile", default="profiles/local", help="Snakemake profile folder (default profiles/local)"
)
SITE = arg(
    "--site",
    type=Path,
    default=Path("profiles/slurm/site.yaml"),
    help="site settings file (default profiles/slurm/site.yaml; "
    "PMPIPE_SITE and PMPIPE_SLURM_* variables win)",
)
SNAKEFILE = arg(
    "--snakefile", type=Path, help="Snakefile (default: the one of the checkout pmpipe runs from)"
)

ACCURACY = (
    PARTICLES,
    arg("--box", type=float, default=256.0, help="box size, Mpc/h"),
    STEPS,
    arg("--seed", type=int, default=0, help="white-noise seed"),
    JSON,
)

NEUTRINO_RUNS = (
    arg("--m-nu", type=float, default=0.15, help="Σm_ν of the massive run, eV (default 0.15)"),
    arg("--steps", type=int, default=30, help="PM steps equal in a (default 30)"),
    arg("--a-init", type=float, default=0.02, help="scale factor of the ICs (default 0.02)"),
    arg("--seed", type=int, default=3, help="white-noise seed (default 3)"),
)
