"""The subcommands of ``pmpipe``, one table: each command's name, help, handler (a function of
the parsed arguments returning the exit status) and arguments, with the bench targets nested
(pmpipe.cli.bench_commands)."""

from __future__ import annotations

from pathlib import Path

from pmpipe.cli import campaign_commands, machine_commands, store_commands
from pmpipe.cli.arguments import CAMPAIGN, RESULTS, SITE, Command, arg
from pmpipe.cli.bench_commands import BENCH
from pmpipe.results import export
from pmpipe.stages import STAGES

SUBMIT = (
    CAMPAIGN,
    arg(
        "--run",
        action="append",
        metavar="RUN_ID",
        help="only this run (repeatable); default every run not yet complete",
    ),
    arg("--stage", choices=STAGES, help="only this stage of the one --run"),
    SITE,
    RESULTS,
    arg("--logs", type=Path, help="submitit folder (default results/<campaign>/logs/submitit)"),
    arg("--max-parallel", type=int, default=64, help="array elements running at once (default 64)"),
    arg("--dry-run", action="store_true", help="print the sbatch script, submit nothing"),
    arg(
        "--wait",
        action="store_true",
        help="wait for the jobs; exit 1 naming the log of any that failed; "
        "then collect the campaign store when every run was submitted",
    ),
)

COMMANDS = (
    Command(
        "run",
        "run one stage of one simulation, or (all) every stage of one or more simulations "
        "in one process",
        store_commands.run,
        (
            arg("stage", choices=(*STAGES, "all")),
            arg(
                "config",
                nargs="+",
                help="the run's config.json (results/<campaign>/<run_id>/config.json); "
                "several with 'all'",
            ),
        ),
    ),
    Command(
        "plan",
        "table of a campaign's runs: devices, memory, nodes, runtime, Boltzmann tables; "
        "totals: device-hours, disk, jobs, SLURM arrays, files",
        campaign_commands.plan,
        (
            CAMPAIGN,
            RESULTS,
            arg(
                "--all-runs",
                action="store_true",
                help="a row for every run (default: the first and last 10 of a larger campaign)",
            ),
            SITE,
        ),
    ),
    Command(
        "tune",
        "time one PM step for every slab and pencil decomposition of a campaign's devices on "
        "this machine and record the fastest in its decomposition file",
        campaign_commands.tune,
        (
            arg("campaign", help="campaign file with a decomposition section"),
            arg("--repeat", type=int, default=3, help="timed steps per decomposition (best)"),
        ),
    ),
    Command(
        "schema",
        "write the JSON schema of campaign files",
        campaign_commands.schema,
        (
            arg(
                "--output",
                type=Path,
                default=campaign_commands.SCHEMA_PATH,
                help=f"default {campaign_commands.SCHEMA_PATH}",
            ),
        ),
    ),
    Command(
        "show",
        "human summary of a store",
        store_commands.show,
        (arg("store", help="path of a .zarr store"),),
    ),
    Command(
        "verify",
        "check stores against their manifests (every chunk's size and CRC-32); mark damaged "
        "ones for recomputation",
        store_commands.verify,
        (
            arg(
                "paths",
                nargs="+",
                type=Path,
                help="a .zarr store, a run folder or a campaign's results folder",
            ),
            arg(
                "--report-only",
                action="store_true",
                help="leave the completion marker of damaged stores in place",
            ),
        ),
    ),
    Command(
        "doctor",
        "JAX, devices, launcher, jaxdecomp, NCCL, MPI, SLURM and container of this process, "
        "and settings known to break runs",
        machine_commands.doctor,
        (
            arg("--json", action="store_true", help="print the report as JSON"),
            arg(
                "--check",
                action="store_true",
                help="also import every pmpipe module and compare a distributed FFT on "
                "the local devices with numpy's; exit 1 on a problem",
            ),
            arg(
                "--distributed",
                action="store_true",
                help="under srun or mpiexec: every process joins jax.distributed, checks an "
                "all-to-all and a psum over all devices and times the psum; process 0 prints "
                "each process's devices, transport and memory fraction and where they "
                "disagree; exit 1 on a problem",
            ),
        ),
    ),
    Command(
        "collect",
        "campaign summaries.zarr and manifest.csv from its runs",
        campaign_commands.collect,
        (
            CAMPAIGN,
            RESULTS,
            arg(
                "--partial",
                action="store_true",
                help="collect the runs complete so far (the others marked, failed ones with "
                "their error) instead of requiring every run",
            ),
        ),
    ),
    Command(
        "export",
        "a collected campaign as one table for training code: a row per run (and draw), "
        "a column per parameter and per element of every statistic",
        campaign_commands.export,
        (
            arg("folder", type=Path, help="the campaign's results folder, results/<campaign>"),
            arg("--format", choices=export.FORMATS, default="parquet", help="default parquet"),
            arg("--output", type=Path, help="default <folder>/<campaign>.<format>"),
        ),
    ),
    Command(
        "status",
        "how far a campaign is: runs done, running, failed and pending, throughput, time "
        "left, bytes written, the error of each failed run",
        campaign_commands.status,
        (
            arg("folder", type=Path, help="the campaign's results folder, results/<campaign>"),
            arg("--json", action="store_true", help="print the report as JSON"),
        ),
    ),
    Command(
        "submit",
        "submit runs to SLURM with submitit: a campaign as job arrays (every stage of a run "
        "in one job), or one stage of one run",
        campaign_commands.submit,
        SUBMIT,
    ),
    Command("bench", "measure speed and memory, write JSON", subcommands=BENCH),
)
