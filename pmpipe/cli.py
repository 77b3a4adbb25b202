"""The `pmpipe` command."""

from __future__ import annotations

import argparse
import json
import sys


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
    parser = argparse.ArgumentParser(prog="pmpipe", description="Cosmological PM simulation suites")
    sub = parser.add_subparsers(dest="command", required=True)
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
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
