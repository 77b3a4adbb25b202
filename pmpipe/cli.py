"""The `pmpipe` command: run a stage, plan a campaign, write the schema, show or verify
stores, check this machine (doctor), collect a campaign, benchmark."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pmpipe import log

LOG = log.get(__name__)
SCHEMA_PATH = Path("workflow/schemas/campaign.schema.json")


def _run(args) -> int:
    from pmpipe import config
    from pmpipe.stages import runner

    if args.stage == "all":
        from pmpipe.stages import pipeline

        return pipeline.main(args.config)
    if len(args.config) != 1:
        raise config.ConfigError(
            f"pmpipe run {args.stage} takes one config.json (got {len(args.config)}); "
            "'pmpipe run all' takes several"
        )
    return runner.run_checked(args.stage, args.config[0])


def _plan(args) -> int:
    from pmpipe.orchestration import campaign
    from pmpipe.stages import lensing

    camp = campaign.load(args.campaign)
    print(campaign.plan_table(camp))
    if camp.decomposition is not None:
        print(campaign.decomposition_line(camp))
    # per field: the warning of the run that resolves least, and the runs it concerns
    worst: dict[str, tuple[float, str]] = {}
    runs: dict[str, list[str]] = {}
    seen: dict[str, dict] = {}
    for spec in camp.runs:
        key = json.dumps(
            {k: v for k, v in spec.run.model_dump(mode="json").items() if k != "ic"}, sort_keys=True
        )  # seeds change no range: one check per design point
        if key not in seen:
            seen[key] = lensing.resolution_warnings(spec.run)
        for field, (resolved, text) in seen[key].items():
            runs.setdefault(field, []).append(spec.run_id)
            if field not in worst or resolved < worst[field][0]:
                worst[field] = (resolved, text)
    for field, (_, text) in worst.items():
        LOG.warning("warning: %s [%d of the runs]", text, len(runs[field]))
    return 0


def _tune(args) -> int:
    from pmpipe import config, parallel
    from pmpipe.orchestration import campaign, decomposition

    wanted = (config.read_mapping(args.campaign).get("decomposition") or {}).get("devices")
    if isinstance(wanted, int):  # host devices on CPU, before JAX starts
        parallel.request_host_devices(wanted)
    camp = campaign.load(args.campaign)
    d = camp.decomposition
    if d is None or d.file is None:
        raise config.ConfigError(
            f"{args.campaign}: tune needs decomposition.devices and "
            "decomposition.file (where the sweep is recorded)"
        )
    import jax

    box = camp.base.box
    sweep = decomposition.sweep(
        d.devices, box.particles, box.oversample, camp.base.parallel.halo_cells, args.repeat
    )
    decomposition.record(d.file, jax.devices()[0].device_kind, sweep)
    print(
        f"recorded in {d.file}: "
        + ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in sweep.step_seconds.items())
        + f" a step; fastest {decomposition.label(sweep.pdims)}"
    )
    print(campaign.decomposition_line(campaign.load(args.campaign)))
    return 0


def _schema(args) -> int:
    from pmpipe.orchestration import campaign

    campaign.write_schema(args.output)
    print(f"wrote {args.output}")
    return 0


def _show(args) -> int:
    from pmpipe.storage import store

    print(store.describe(args.store))
    return 0


def _doctor(args) -> int:
    from pmpipe import doctor

    facts = doctor.report()
    if args.json:
        json.dump(facts, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(doctor.table(facts))
    if not args.check:
        return 0
    problems = doctor.self_check()
    for problem in problems:
        LOG.error("CHECK FAILED: %s", problem)
    if not problems:
        LOG.info(
            "check: every pmpipe module imports; a distributed FFT on %d local devices "
            "agrees with numpy's",
            len(facts["jax"]["local_devices"]),
        )
    return 1 if problems else 0


def _verify(args) -> int:
    from pmpipe.storage import store

    paths = [p for given in args.paths for p in store.stores_under(given)]
    if not paths:
        raise store.IncompleteStoreError(f"no zarr store in {', '.join(map(str, args.paths))}")
    failed = 0
    for path in paths:
        found = store.problems(path, checksums=True)
        if found:
            failed += 1
            if store.has_marker(path) and not args.report_only:
                store.invalidate(path, found)
        print(
            f"{'FAILED' if found else 'ok':7} {path}" + (f": {'; '.join(found)}" if found else "")
        )
    summary = f"{len(paths)} stores checked, {failed} failed"
    if failed and not args.report_only:
        summary += (
            "; damaged stores lost their completion marker: the next snakemake (or "
            "pmpipe run) makes them again"
        )
    LOG.info("%s", summary)
    return 1 if failed else 0


def _collect(args) -> int:
    from pmpipe.orchestration import aggregate

    folder = aggregate.collect(args.campaign, args.results)
    print(f"wrote {folder / 'summaries.zarr'} and {folder / 'manifest.csv'}")
    return 0


def _submit(args) -> int:
    import os

    from pmpipe import config, parallel
    from pmpipe.orchestration import aggregate, campaign, launch, site
    from pmpipe.stages import runner

    camp = campaign.load(args.campaign)
    campaign.check_fits(camp)
    slurm_site = site.load_site(args.site, os.environ)
    specs = list(camp.runs)
    if args.run:
        known = {s.run_id for s in specs}
        unknown = [r for r in args.run if r not in known]
        if unknown:
            raise config.ConfigError(
                f"--run {', '.join(unknown)}: not a run of {args.campaign} "
                f"(its runs: {', '.join(sorted(known))})"
            )
        specs = [s for s in specs if s.run_id in args.run]
    if args.stage and len(specs) != 1:
        raise config.ConfigError("--stage submits one stage of one run: name the run with --run")
    if args.max_parallel < 1:
        raise config.ConfigError(f"--max-parallel must be at least 1 (got {args.max_parallel})")
    folder = (args.logs or args.results / camp.name / "logs" / "submitit").absolute()
    if args.stage:
        if args.dry_run:
            job = launch.campaign_job(camp, specs[0], slurm_site, args.stage)
            print(
                launch.sbatch_script(
                    job, folder, python=launch.job_python(job, slurm_site) or sys.executable
                )
            )
            return 0
        campaign.write_run_files(camp, args.results)
        parallel.use_compilation_cache(args.results / ".jax_cache")  # the jobs inherit it
        jobs = [launch.submit_stage(camp, specs[0], args.stage, args.results, folder, slurm_site)]
        labels = [specs[0].run_id]
    else:
        campaign_dir = args.results / camp.name
        chosen = {s.run_id for s in specs}
        groups = [
            [
                s
                for s in group
                if s.run_id in chosen and runner.run_status(campaign_dir / s.run_id) != "complete"
            ]
            for group in campaign.job_groups(camp.runs, camp.execution.job_size()).values()
        ]
        groups = [g for g in groups if g]
        for spec in specs:
            if not any(spec in g for g in groups):
                print(f"{spec.run_id}: complete, not submitted")
        if args.dry_run:
            if groups:
                job = launch.array_job(camp, groups, slurm_site)
                print(
                    launch.sbatch_script(
                        job,
                        folder,
                        python=launch.job_python(job, slurm_site) or sys.executable,
                        array_size=len(groups),
                        array_parallelism=args.max_parallel,
                    )
                )
            return 0
        campaign.write_run_files(camp, args.results)
        parallel.use_compilation_cache(args.results / ".jax_cache")  # the jobs inherit it
        jobs = (
            launch.submit_campaign(
                camp, groups, args.results, folder, slurm_site, args.max_parallel
            )
            if groups
            else []
        )
        labels = [", ".join(s.run_id for s in g) for g in groups]
    for label, job in zip(labels, jobs):
        print(f"{label}: SLURM job {job.job_id}, log {job.paths.stdout}")
    if not args.wait:
        return 0
    failed = 0
    for label, job in zip(labels, jobs):
        try:
            job.results()  # one result per task (process)
        except Exception as err:  # noqa: BLE001  submitit raises its own errors for failed or lost jobs
            failed += 1
            LOG.error(
                "error: %s: SLURM job %s failed (%s); log: %s",
                label,
                job.job_id,
                type(err).__name__,
                job.paths.stdout,
            )
    if failed:
        return 1
    if not args.stage and not args.run:
        out = aggregate.collect(args.campaign, args.results)
        print(f"wrote {out / 'summaries.zarr'} and {out / 'manifest.csv'}")
    return 0


def _bench(args) -> int:
    from pmpipe import bench

    record = bench.bench_nbody(
        args.particles,
        args.steps,
        tuple(args.pdims),
        args.oversample,
        args.halo,
        compare=args.compare,
        pmwd_path=args.pmwd,
    )
    if args.json:
        bench.write_json(record, args.json)
    json.dump(record, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _bench_accuracy(args) -> int:
    from pmpipe import bench, bench_accuracy

    if args.target == "steps":
        record = bench_accuracy.bench_steps(
            args.particles, args.box, args.steps, args.reference_steps, args.oversample, args.seed
        )
    else:
        record = bench_accuracy.bench_force(
            args.particles,
            args.box,
            args.steps,
            tuple(args.oversamples),
            args.reference_oversample,
            args.spacing,
            args.seed,
        )
    if args.json:
        bench.write_json(record, args.json)
    json.dump(record, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _bench_campaign(args) -> int:
    from pmpipe import bench, bench_campaign

    try:
        record = bench_campaign.bench_campaign(
            args.campaign, args.profile, args.workdir, args.cores, args.snakefile
        )
    except bench_campaign.CampaignFailed as err:
        LOG.error("error: %s", err)
        return 1
    if args.json:
        bench.write_json(record, args.json)
    json.dump(record, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _bench_scaling(args) -> int:
    from pmpipe import bench, config, parallel, scaling

    _, processes = parallel.launcher_processes()
    devices = sorted({d for d in args.devices if d % processes == 0})
    if len(devices) < len(set(args.devices)):
        LOG.info(
            "--devices: %d processes measure %s devices",
            processes,
            " ".join(map(str, devices)) or "no",
        )
    if not devices:
        raise config.ConfigError(
            f"--devices {' '.join(map(str, args.devices))}: each count must "
            f"be a multiple of the {processes} processes launched"
        )
    try:  # the options checked before JAX starts
        scaling.plan(
            args.particles, devices, args.oversample, args.halo, args.scaling, args.decompositions
        )
    except ValueError as err:
        raise config.ConfigError(str(err)) from None
    parallel.start_processes(max(devices))
    import jax

    if max(devices) > jax.device_count():
        raise config.ConfigError(
            f"--devices {max(devices)}: {jax.device_count()} devices are "
            f"visible to the {processes} process(es)"
        )
    record = scaling.run(
        args.particles,
        devices,
        args.oversample,
        args.halo,
        args.repeat,
        args.scaling,
        args.decompositions,
    )
    if args.trace:
        record["trace"] = scaling.traced_steps(record, args.trace, args.trace_steps)
    if jax.process_index() != 0:
        return 0
    if args.json:
        bench.write_json(record, args.json)
    if args.plot:
        scaling.plot(record, args.plot)
    print(scaling.table(record))
    if args.trace:
        print(scaling.trace_table(record["trace"]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from pmpipe import config
    from pmpipe.stages import STAGES

    parser = argparse.ArgumentParser(prog="pmpipe", description="Cosmological PM simulation suites")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run one stage of one simulation, or (all) every stage of "
        "one or more simulations in one process",
    )
    run.add_argument("stage", choices=(*STAGES, "all"))
    run.add_argument(
        "config",
        nargs="+",
        help="the run's config.json (results/<campaign>/<run_id>/config.json); several with 'all'",
    )
    run.set_defaults(func=_run)

    plan = sub.add_parser(
        "plan", help="table of a campaign's runs: devices, memory, nodes, runtime"
    )
    plan.add_argument("campaign", help="campaign file (YAML or JSON)")
    plan.set_defaults(func=_plan)

    tune = sub.add_parser(
        "tune",
        help="time one PM step for every slab and pencil decomposition "
        "of a campaign's devices on this machine and record the "
        "fastest in its decomposition file",
    )
    tune.add_argument("campaign", help="campaign file with a decomposition section")
    tune.add_argument("--repeat", type=int, default=3, help="timed steps per decomposition (best)")
    tune.set_defaults(func=_tune)

    schema = sub.add_parser("schema", help="write the JSON schema of campaign files")
    schema.add_argument("--output", type=Path, default=SCHEMA_PATH, help=f"default {SCHEMA_PATH}")
    schema.set_defaults(func=_schema)

    show = sub.add_parser("show", help="human summary of a store")
    show.add_argument("store", help="path of a .zarr store")
    show.set_defaults(func=_show)

    verify = sub.add_parser(
        "verify",
        help="check stores against their manifests (every chunk's "
        "size and CRC-32); mark damaged ones for recomputation",
    )
    verify.add_argument(
        "paths",
        nargs="+",
        type=Path,
        help="a .zarr store, a run folder or a campaign's results folder",
    )
    verify.add_argument(
        "--report-only",
        action="store_true",
        help="leave the completion marker of damaged stores in place",
    )
    verify.set_defaults(func=_verify)

    doctor = sub.add_parser(
        "doctor",
        help="JAX, devices, launcher, jaxdecomp, NCCL, MPI, SLURM and "
        "container of this process, and settings known to break runs",
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument(
        "--check",
        action="store_true",
        help="also import every pmpipe module and compare a distributed FFT on "
        "the local devices with numpy's; exit 1 on a problem",
    )
    doctor.set_defaults(func=_doctor)

    collect = sub.add_parser(
        "collect", help="campaign summaries.zarr and manifest.csv from its runs"
    )
    collect.add_argument("campaign", help="campaign file (YAML or JSON)")
    collect.add_argument("--results", type=Path, default=Path("results"), help="results folder")
    collect.set_defaults(func=_collect)

    submit = sub.add_parser(
        "submit",
        help="submit runs to SLURM with submitit: a campaign as a job array (every "
        "stage of a run in one job), or one stage of one run",
    )
    submit.add_argument("campaign", help="campaign file (YAML or JSON)")
    submit.add_argument(
        "--run",
        action="append",
        metavar="RUN_ID",
        help="only this run (repeatable); default every run not yet complete",
    )
    submit.add_argument("--stage", choices=STAGES, help="only this stage of the one --run")
    submit.add_argument(
        "--site",
        type=Path,
        default=Path("profiles/slurm/site.yaml"),
        help="site settings file (default profiles/slurm/site.yaml; "
        "PMPIPE_SITE and PMPIPE_SLURM_* variables win)",
    )
    submit.add_argument("--results", type=Path, default=Path("results"), help="results folder")
    submit.add_argument(
        "--logs", type=Path, help="submitit folder (default results/<campaign>/logs/submitit)"
    )
    submit.add_argument(
        "--max-parallel", type=int, default=64, help="array elements running at once (default 64)"
    )
    submit.add_argument(
        "--dry-run", action="store_true", help="print the sbatch script, submit nothing"
    )
    submit.add_argument(
        "--wait",
        action="store_true",
        help="wait for the jobs; exit 1 naming the log of any that failed; "
        "then collect the campaign store when every run was submitted",
    )
    submit.set_defaults(func=_submit)

    bench_parser = sub.add_parser("bench", help="measure speed and memory, write JSON")
    targets = bench_parser.add_subparsers(dest="target", required=True)
    campaign = targets.add_parser(
        "campaign",
        help="a campaign end to end through Snakemake in a fresh working directory: "
        "wall time, runs per hour, physics time and duty, compilations, "
        "bytes written, memory",
    )
    campaign.add_argument("campaign", help="campaign file (YAML or JSON)")
    campaign.add_argument(
        "--profile",
        default="profiles/local",
        help="Snakemake profile folder (default profiles/local)",
    )
    campaign.add_argument(
        "--workdir",
        type=Path,
        help="working directory, without results of this campaign "
        "(default: a new temporary folder)",
    )
    campaign.add_argument("--cores", type=int, help="snakemake --cores (default: the profile's)")
    campaign.add_argument(
        "--snakefile",
        type=Path,
        help="Snakefile (default: the one of the checkout pmpipe runs from)",
    )
    campaign.add_argument("--json", metavar="PATH", help="also write the record to PATH")
    campaign.set_defaults(func=_bench_campaign)
    bench = targets.add_parser(
        "nbody",
        help="ICs, LPT and PM steps of one simulation in this process, with per-component timings",
    )
    bench.add_argument("--particles", type=int, required=True, help="particles per side, N")
    bench.add_argument("--steps", type=int, default=10, help="PM steps from a=0.1 to a=1")
    bench.add_argument(
        "--pdims",
        type=int,
        nargs=2,
        default=[1, 1],
        metavar=("PX", "PY"),
        help="device mesh (on CPU, XLA_FLAGS sets the device count)",
    )
    bench.add_argument("--oversample", type=int, default=1, help="force mesh / particle grid, B")
    bench.add_argument("--halo", type=int, default=8, help="halo cells (several devices)")
    bench.add_argument(
        "--compare",
        choices=["jaxpm", "pmwd"],
        help="also run a peer in its own process: jaxpm, JaxPM 0.1.6 (pip install "
        "-e '.[bench]') from the same linear field, with accuracy against a "
        "converged reference; pmwd, the same job with pmwd (a checkout on "
        "PYTHONPATH or --pmwd, and mcfit)",
    )
    bench.add_argument("--pmwd", metavar="DIR", help="folder that holds the pmwd package")
    bench.add_argument("--json", metavar="PATH", help="also write the record to PATH")
    bench.set_defaults(func=_bench)
    scaling = targets.add_parser(
        "scaling",
        help="strong and weak scaling of one PM step and its parts (paint, FFT, read) "
        "over device counts, slabs and pencils: a table, JSON and a plot",
    )
    scaling.add_argument(
        "--particles",
        type=int,
        required=True,
        help="particles per side, N (weak scaling: on the fewest devices)",
    )
    scaling.add_argument(
        "--devices",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8],
        help="device counts (default 1 2 4 8; with several processes, the "
        "multiples of their number); on CPU the processes ask XLA for them",
    )
    scaling.add_argument(
        "--scaling",
        nargs="+",
        choices=["strong", "weak"],
        default=["strong", "weak"],
        help="which scalings (default both)",
    )
    scaling.add_argument(
        "--decompositions",
        nargs="+",
        choices=["slab", "pencil"],
        default=["slab", "pencil"],
        help="which decompositions (default both)",
    )
    scaling.add_argument("--oversample", type=int, default=1, help="force mesh / particle grid, B")
    scaling.add_argument("--halo", type=int, default=4, help="halo cells (default 4)")
    scaling.add_argument("--repeat", type=int, default=3, help="timed calls per part, best kept")
    scaling.add_argument("--json", metavar="PATH", help="write the record to PATH")
    scaling.add_argument("--plot", metavar="PNG", help="draw time and efficiency to PNG")
    scaling.add_argument(
        "--trace",
        metavar="DIR",
        help="write a JAX profiler trace of PM steps on the most devices to DIR "
        "and print its time by category",
    )
    scaling.add_argument("--trace-steps", type=int, default=3, help="steps traced (default 3)")
    scaling.set_defaults(func=_bench_scaling)
    steps = targets.add_parser(
        "steps",
        help="P(k) of S steps equal in a, ln a and D1 against "
        "a converged reference from the same ICs",
    )
    force = targets.add_parser(
        "force",
        help="P(k) of N particles with force meshes B = 1, "
        "2, ... against 2N particles from the same "
        "large-scale modes and steps",
    )
    for target in (steps, force):
        target.add_argument("--particles", type=int, required=True, help="particles per side, N")
        target.add_argument("--box", type=float, default=256.0, help="box size, Mpc/h")
        target.add_argument("--steps", type=int, default=10, help="PM steps from a=0.1 to a=1")
        target.add_argument("--seed", type=int, default=0, help="white-noise seed")
        target.add_argument("--json", metavar="PATH", help="also write the record to PATH")
        target.set_defaults(func=_bench_accuracy)
    steps.add_argument(
        "--reference-steps", type=int, default=128, help="steps (equal in ln a) of the reference"
    )
    steps.add_argument("--oversample", type=int, default=1, help="force mesh / particle grid, B")
    force.add_argument(
        "--oversamples", type=int, nargs="+", default=[1, 2], help="force meshes B to measure"
    )
    force.add_argument(
        "--reference-oversample",
        type=int,
        default=2,
        help="force mesh B of the 2N-particle reference",
    )
    force.add_argument(
        "--spacing", default="a", choices=config.STEP_SPACINGS, help="what the steps are equal in"
    )
    return parser


def main(argv=None) -> int:
    from pmpipe import config
    from pmpipe.storage import store

    args = build_parser().parse_args(argv)
    log.configure()
    try:
        return args.func(args)
    except (config.ConfigError, store.IncompleteStoreError) as err:
        LOG.error("error: %s", err)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
