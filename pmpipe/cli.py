"""The `pmpipe` command: run a stage, plan a campaign, write the schema, show a store,
collect a campaign, benchmark."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SCHEMA_PATH = Path("workflow/schemas/campaign.schema.json")


def _run(args) -> int:
    from pmpipe import stages

    return stages.run_checked(args.stage, args.config)


def _plan(args) -> int:
    from pmpipe import campaign, config

    camp = config.load_campaign(args.campaign)
    print(campaign.plan_table(camp))
    return 0


def _schema(args) -> int:
    from pmpipe import campaign

    campaign.write_schema(args.output)
    print(f"wrote {args.output}")
    return 0


def _show(args) -> int:
    from pmpipe import store

    print(store.describe(args.store))
    return 0


def _collect(args) -> int:
    from pmpipe import aggregate

    folder = aggregate.collect(args.campaign, args.results)
    print(f"wrote {folder / 'summaries.zarr'} and {folder / 'manifest.csv'}")
    return 0


def _bench(args) -> int:
    from pmpipe import bench

    record = bench.bench_nbody(args.mesh, args.steps, tuple(args.pdims), args.oversample,
                               args.halo, compare=args.compare)
    if args.json:
        bench.write_json(record, args.json)
    json.dump(record, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from pmpipe.stages import STAGES

    parser = argparse.ArgumentParser(prog="pmpipe", description="Cosmological PM simulation suites")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one stage of one simulation")
    run.add_argument("stage", choices=STAGES)
    run.add_argument("config", help="the run's config.json (results/<campaign>/<run_id>/config.json)")
    run.set_defaults(func=_run)

    plan = sub.add_parser("plan", help="table of a campaign's runs: devices, memory, nodes, runtime")
    plan.add_argument("campaign", help="campaign file (YAML or JSON)")
    plan.set_defaults(func=_plan)

    schema = sub.add_parser("schema", help="write the JSON schema of campaign files")
    schema.add_argument("--output", type=Path, default=SCHEMA_PATH, help=f"default {SCHEMA_PATH}")
    schema.set_defaults(func=_schema)

    show = sub.add_parser("show", help="human summary of a store")
    show.add_argument("store", help="path of a .zarr store")
    show.set_defaults(func=_show)

    collect = sub.add_parser("collect", help="campaign summaries.zarr and manifest.csv from its runs")
    collect.add_argument("campaign", help="campaign file (YAML or JSON)")
    collect.add_argument("--results", type=Path, default=Path("results"), help="results folder")
    collect.set_defaults(func=_collect)

    bench = sub.add_parser("bench", help="measure speed and memory, write JSON")
    bench.add_argument("target", choices=["nbody"], help="what to benchmark")
    bench.add_argument("--mesh", type=int, required=True, help="particles per side, N")
    bench.add_argument("--steps", type=int, default=10, help="PM steps from a=0.1 to a=1")
    bench.add_argument("--pdims", type=int, nargs=2, default=[1, 1], metavar=("PX", "PY"),
                       help="device mesh (on CPU, XLA_FLAGS sets the device count)")
    bench.add_argument("--oversample", type=int, default=1, help="force mesh / particle grid, B")
    bench.add_argument("--halo", type=int, default=8, help="halo cells (several devices)")
    bench.add_argument("--compare", choices=["jaxpm"],
                       help="also run JaxPM 0.1.6 (pip install -e '.[bench]') from the same "
                            "linear field and report accuracy against a converged reference")
    bench.add_argument("--json", metavar="PATH", help="also write the record to PATH")
    bench.set_defaults(func=_bench)
    return parser


def main(argv=None) -> int:
    from pmpipe import config, store

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (config.ConfigError, store.IncompleteStoreError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
