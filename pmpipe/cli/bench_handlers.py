"""``pmpipe bench``: the benchmarks' commands, each printing its JSON record."""

from __future__ import annotations

import json
import sys

from pmpipe.runtime import log

LOG = log.get(__name__)


def _emit(record: dict, path) -> None:
    """Write the record to ``path`` (when given) and print it."""
    from pmpipe.bench import pm_core

    if path:
        pm_core.write_json(record, path)
    json.dump(record, sys.stdout, indent=2)
    sys.stdout.write("\n")


def suite(args) -> int:
    """``pmpipe bench suite``: the device figures of docs/performance.md in one command."""
    from pmpipe.bench import campaign_timing, suite

    plan = suite.Suite(
        tuple(args.sizes),
        tuple(args.oversamples),
        tuple(args.peers),
        args.campaign_runs,
        args.scaling_particles,
        args.pmwd,
    )
    if args.dry_run:
        for line in suite.describe(plan, max(suite.local_gpus(), 1)):
            print(line)
        return 0
    record = suite.run(plan, args.budget, args.json, campaign_timing.default_snakefile().parent)
    print(suite.table(record))
    return 0 if all(e["status"] == "done" for e in record["entries"]) else 1


def nbody(args) -> int:
    """``pmpipe bench nbody``: the PM core of one simulation."""
    from pmpipe.bench import pm_core

    record = pm_core.bench_nbody(
        args.particles,
        args.steps,
        tuple(args.pdims),
        args.oversample,
        args.halo,
        compare=args.compare,
        pmwd_path=args.pmwd,
    )
    _emit(record, args.json)
    return 0


def accuracy(args) -> int:
    """``pmpipe bench steps`` and ``pmpipe bench force``: accuracy against converged references."""
    from pmpipe.bench.validation import accuracy

    if args.target == "steps":
        record = accuracy.bench_steps(
            args.particles, args.box, args.steps, args.reference_steps, args.oversample, args.seed
        )
    else:
        record = accuracy.bench_force(
            args.particles,
            args.box,
            args.steps,
            tuple(args.oversamples),
            args.reference_oversample,
            args.spacing,
            args.seed,
        )
    _emit(record, args.json)
    return 0


def _neutrino_runs(args) -> None:
    """Refuse arguments that make no comparison, naming the flag, before any run."""
    from pmpipe.bench.validation.nonlinear import SNAPSHOT
    from pmpipe.physics.theory.boltzmann_tables import NU_A_MIN
    from pmpipe.run import config
    from pmpipe.run.universe import M_NU_MAX

    if not 0.0 < args.m_nu <= M_NU_MAX:
        raise config.ConfigError(f"--m-nu {args.m_nu}: give 0 < Σm_ν <= {M_NU_MAX:g} eV")
    if not NU_A_MIN <= args.a_init < SNAPSHOT:
        raise config.ConfigError(
            f"--a-init {args.a_init}: give {NU_A_MIN} <= a_init < {SNAPSHOT} (the snapshot)"
        )
    if args.steps < 1 or args.particles < 8:
        raise config.ConfigError("--steps must be >= 1 and --particles >= 8")


def growth(args) -> int:
    """``pmpipe bench growth``: low-k growth and suppression against CAMB's linear theory."""
    from pmpipe.bench.validation import nonlinear
    from pmpipe.run import config

    _neutrino_runs(args)
    if args.bins < 1 or args.bins > args.particles // 2:
        raise config.ConfigError(f"--bins {args.bins}: give 1 to {args.particles // 2}")
    record = nonlinear.bench_growth(
        args.particles, args.box, args.m_nu, args.steps, args.a_init, args.seed, args.bins
    )
    _emit(record, args.json)
    return 0


def nonlinear(args) -> int:
    """``pmpipe bench nonlinear``: P(k) and the suppression against HMcode-2020."""
    from pmpipe.bench.validation import nonlinear

    _neutrino_runs(args)
    record = nonlinear.bench_nonlinear(
        args.particles, args.box, args.m_nu, args.steps, args.a_init, args.seed, args.k_max
    )
    _emit(record, args.json)
    return 0


def raytrace(args) -> int:
    """``pmpipe bench raytrace``: seconds per lens plane, ray tracing and Born."""
    from pmpipe.bench import raytrace

    if args.nside:
        record = raytrace.bench_raytrace_healpix(args.nside, args.planes, args.box, args.seed)
    else:
        record = raytrace.bench_raytrace(
            args.pixels, args.planes, args.mesh, args.box, args.fov, args.seed
        )
    _emit(record, args.json)
    return 0


def postborn(args) -> int:
    """``pmpipe bench postborn``: ray-traced against Born maps of the same planes."""
    from pmpipe.bench.validation import postborn

    _emit(
        postborn.bench_postborn(
            args.particles, args.pixels, args.seeds, args.steps, args.smoothing
        ),
        args.json,
    )
    return 0


def pseudo_cl(args) -> int:
    """``pmpipe bench pseudo-cl``: the masked-sky estimator on Gaussian realisations."""
    from pmpipe.bench.validation import pseudo_cl_gaussian
    from pmpipe.run import files

    try:
        if args.pixels:
            mask = None if args.mask is None else files.read_flat_map(args.mask, args.pixels)
        else:
            mask = None if args.mask is None else files.read_healpix_map(args.mask, args.nside)
    except files.ConfigError as err:
        LOG.error("error: --mask %s", err)
        return 2
    if args.pixels:
        record = pseudo_cl_gaussian.bench_pseudo_cl_flat(
            args.pixels, args.realisations, mask=mask, seed=args.seed
        )
    else:
        record = pseudo_cl_gaussian.bench_pseudo_cl(args.nside, args.realisations, mask, args.seed)
    _emit(record, args.json)
    return 0


def nuisances(args) -> int:
    """``pmpipe bench nuisances``: the survey nuisances of resolved maps against pyccl."""
    from pmpipe.bench.validation import nuisances

    try:
        record = nuisances.bench_nuisances(
            args.particles, args.pixels, args.seeds, args.steps, args.box
        )
    except ValueError as err:
        LOG.error("error: %s", err)
        return 2
    _emit(record, args.json)
    return 0


def limber(args) -> int:
    """``pmpipe bench limber``: the convergence C_ell against pyccl's halofit Limber."""
    from pmpipe.bench.validation import limber

    _emit(limber.bench_limber(args.particles, args.seeds, args.steps, args.nside), args.json)
    return 0


def draws(args) -> int:
    """``pmpipe bench draws``: what an extra draw of the nuisances costs."""
    from pmpipe.bench import draw_cost

    try:
        record = draw_cost.bench_draws(args.particles, args.pixels, args.nside, args.draws)
    except ValueError as err:
        LOG.error("error: %s", err)
        return 2
    _emit(record, args.json)
    return 0


def campaign(args) -> int:
    """``pmpipe bench campaign``: a campaign end to end through Snakemake."""
    from pmpipe.bench import campaign_timing

    try:
        record = campaign_timing.bench_campaign(
            args.campaign, args.profile, args.workdir, args.cores, args.snakefile, args.programs
        )
    except campaign_timing.CampaignFailed as err:
        LOG.error("error: %s", err)
        return 1
    _emit(record, args.json)
    return 0


def plan(args) -> int:
    """``pmpipe bench plan``: how long Snakemake takes to plan a campaign, and what it writes."""
    from pmpipe.bench import campaign_timing, plan

    try:
        record = plan.bench_plan(
            args.campaign, args.profile, args.samples, args.snakefile, args.particles
        )
    except campaign_timing.CampaignFailed as err:
        LOG.error("error: %s", err)
        return 1
    _emit(record, args.json)
    return 0


def linear(args) -> int:
    """``pmpipe bench linear``: the linear P(k) of CAMB, CLASS and Eisenstein-Hu runs against
    CAMB at high precision."""
    from pmpipe.bench.validation import linear
    from pmpipe.run import config, universe

    fields = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in config.Cosmology.model_fields:
            raise config.ConfigError(
                f"--set {item}: not a cosmology field ({', '.join(config.Cosmology.model_fields)})"
            )
        if name not in universe.NUMERIC_FIELDS:  # neutrino_hierarchy: a name
            fields[name] = value
            continue
        try:
            fields[name] = float(value)
        except ValueError:
            raise config.ConfigError(f"--set {item}: {value!r} is not a number") from None
    config.validate(config.Cosmology, fields, "--set")
    if not 0.01 <= args.k_max <= 100.0:
        raise config.ConfigError(f"--k-max {args.k_max}: give 0.01 to 100 h/Mpc")
    _emit(linear.bench_linear(fields, args.k_max), args.json)
    return 0


def store(args) -> int:
    """``pmpipe bench store``: write, read and verify throughput of a particle store."""
    from pmpipe.bench import stores
    from pmpipe.run import config
    from pmpipe.runtime import parallel

    if args.particles < 1 or args.repeat < 1 or min(args.pdims) < 1:
        raise config.ConfigError("--particles, --repeat and --pdims must be positive")
    if args.dir is not None and not args.dir.is_dir():
        raise config.ConfigError(f"--dir {args.dir}: no such folder")
    parallel.start_processes(args.pdims[0] * args.pdims[1])
    _emit(stores.bench_store(args.particles, tuple(args.pdims), args.repeat, args.dir), args.json)
    return 0


def scaling(args) -> int:
    """``pmpipe bench scaling``: one PM step over device counts and decompositions."""
    from pmpipe.bench import pm_core, scaling
    from pmpipe.run import config
    from pmpipe.runtime import parallel

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
        pm_core.write_json(record, args.json)
    if args.plot:
        scaling.plot(record, args.plot)
    print(scaling.table(record))
    if args.trace:
        print(scaling.trace_table(record["trace"]))
    return 0
