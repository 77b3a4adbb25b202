"""The targets of ``pmpipe bench``: each benchmark's name, help, handler and arguments."""

from __future__ import annotations

from pathlib import Path

from pmpipe.cli import bench_handlers
from pmpipe.cli.arguments import (
    ACCURACY,
    CAMPAIGN,
    JSON,
    NEUTRINO_RUNS,
    OVERSAMPLE,
    PARTICLES,
    PROFILE,
    SNAKEFILE,
    STEPS,
    Command,
    arg,
)
from pmpipe.physics.evolution.timesteps import STEP_SPACINGS

BENCH = (
    Command(
        "suite",
        "the device figures of docs/performance.md in one command, each measurement in a "
        "process of its own: PM jobs against pmwd and JaxPM, the largest N that fits, a "
        "campaign with lensing, scaling over the local devices",
        bench_handlers.suite,
        (
            arg("--sizes", type=int, nargs="+", default=[128, 256, 512], help="particles per side"),
            arg("--oversamples", type=int, nargs="+", default=[1, 2], help="force meshes B"),
            arg(
                "--peers",
                nargs="*",
                choices=["pmwd", "jaxpm"],
                default=["pmwd", "jaxpm"],
                help="peers compared (default both; JaxPM at B = 1)",
            ),
            arg("--campaign-runs", type=int, default=16, help="runs of the campaign (default 16)"),
            arg(
                "--scaling-particles",
                type=int,
                default=256,
                help="particles per side of the scaling (default 256)",
            ),
            arg("--pmwd", metavar="DIR", help="folder that holds the pmwd package"),
            arg(
                "--budget",
                type=float,
                default=3600.0,
                help="seconds after which no measurement starts and the running one stops "
                "(default 3600)",
            ),
            arg("--dry-run", action="store_true", help="print what it would measure"),
            JSON,
        ),
    ),
    Command(
        "campaign",
        "a campaign end to end through Snakemake in a fresh working directory: wall time, "
        "runs per hour, physics time and duty, compilations, bytes written, memory",
        bench_handlers.campaign,
        (
            CAMPAIGN,
            PROFILE,
            arg(
                "--workdir",
                type=Path,
                help="working directory, without results of this campaign "
                "(default: a new temporary folder)",
            ),
            arg("--cores", type=int, help="snakemake --cores (default: the profile's)"),
            SNAKEFILE,
            arg(
                "--programs",
                type=Path,
                help="persistent compilation cache folder for the jobs, as a long campaign's "
                "later jobs find what its first compiled (default: the campaign's own, empty)",
            ),
            JSON,
        ),
    ),
    Command(
        "plan",
        "how long `snakemake -n` takes to plan a campaign in a fresh folder, and the files it "
        "leaves under results/ (none); how long `pmpipe plan` and `pmpipe status` take",
        bench_handlers.plan,
        (
            CAMPAIGN,
            PROFILE,
            arg(
                "--samples",
                type=int,
                help="resize the campaign's latin_hypercube or sobol design to this many points",
            ),
            arg(
                "--particles",
                type=int,
                help="particles per side of the runs (smaller runs: less disk for the "
                "free-space check of a large campaign)",
            ),
            SNAKEFILE,
            JSON,
        ),
    ),
    Command(
        "nbody",
        "ICs, LPT and PM steps of one simulation in this process, with per-component timings",
        bench_handlers.nbody,
        (
            PARTICLES,
            STEPS,
            arg(
                "--pdims",
                type=int,
                nargs=2,
                default=[1, 1],
                metavar=("PX", "PY"),
                help="device mesh (on CPU, XLA_FLAGS sets the device count)",
            ),
            OVERSAMPLE,
            arg("--halo", type=int, default=8, help="halo cells (several devices)"),
            arg(
                "--compare",
                choices=["jaxpm", "pmwd"],
                help="also run a peer in its own process: jaxpm, JaxPM 0.1.6 (pip install "
                "-e '.[bench]') from the same linear field, with accuracy against a "
                "converged reference; pmwd, the same job with pmwd (a checkout on "
                "PYTHONPATH or --pmwd, and mcfit)",
            ),
            arg("--pmwd", metavar="DIR", help="folder that holds the pmwd package"),
            JSON,
        ),
    ),
    Command(
        "linear",
        "linear P(k) at a = 1 of CAMB and CLASS (pmpipe's settings) and the Eisenstein-Hu fits "
        "against CAMB at high precision, same A_s",
        bench_handlers.linear,
        (
            arg(
                "--set",
                action="append",
                default=[],
                metavar="NAME=VALUE",
                help="a cosmology field (repeatable; the others fiducial), e.g. --set A_s=2e-9",
            ),
            arg("--k-max", type=float, default=1.0, help="largest k compared, h/Mpc (default 1)"),
            JSON,
        ),
    ),
    Command(
        "growth",
        "low-k growth and neutrino suppression of paired N-body runs (massless and Σm_ν) "
        "against CAMB's linear theory, same realisation",
        bench_handlers.growth,
        (
            arg("--particles", type=int, default=128, help="particles per side (default 128)"),
            arg("--box", type=float, default=1000.0, help="box size, Mpc/h (default 1000)"),
            *NEUTRINO_RUNS,
            arg("--bins", type=int, default=6, help="lowest k bins reported (default 6)"),
            JSON,
        ),
    ),
    Command(
        "nonlinear",
        "non-linear P(k) at a = 1 of paired fixed-amplitude runs against HMcode-2020, with the "
        "PM's resolution deficit and Eisenstein-Hu's linear error beside it, and the neutrino "
        "suppression of total matter against HMcode-2020's",
        bench_handlers.nonlinear,
        (
            arg("--particles", type=int, default=128, help="particles per side (default 128)"),
            arg("--box", type=float, default=256.0, help="box size, Mpc/h (default 256)"),
            *NEUTRINO_RUNS,
            arg("--k-max", type=float, default=1.0, help="last k reported, h/Mpc (default 1)"),
            JSON,
        ),
    ),
    Command(
        "raytrace",
        "seconds per lens plane of flat-sky ray tracing and of Born on the same Gaussian "
        "planes (fiducial linear power, out to a source at z = 1); with --nside, of full-sky "
        "ray tracing through Gaussian shells",
        bench_handlers.raytrace,
        (
            arg("--pixels", type=int, default=2048, help="map pixels per side (default 2048)"),
            arg("--planes", type=int, default=20, help="lens planes (default 20)"),
            arg("--mesh", type=int, default=512, help="plane grid cells per side (default 512)"),
            arg("--box", type=float, default=1000.0, help="box size, Mpc/h (default 1000)"),
            arg("--fov", type=float, default=5.0, help="map side, degrees (default 5)"),
            arg("--seed", type=int, default=1, help="seed of the planes (default 1)"),
            arg(
                "--nside",
                type=int,
                default=0,
                help="full-sky maps of this nside instead of the flat map (default: flat)",
            ),
            JSON,
        ),
    ),
    Command(
        "postborn",
        "ray-traced against Born lensing of the same N-body planes: C_ell ratio in the "
        "resolved range, rotation power, skewness, kurtosis and peak counts, per seed and source",
        bench_handlers.postborn,
        (
            arg("--particles", type=int, default=32, help="particles per side (default 32)"),
            arg("--pixels", type=int, default=64, help="map pixels per side (default 64)"),
            arg("--seeds", type=int, default=4, help="realisations (default 4)"),
            arg("--steps", type=int, default=10, help="N-body steps (default 10)"),
            arg("--smoothing", type=float, default=2.0, help="arcmin (default 2)"),
            JSON,
        ),
    ),
    Command(
        "pseudo-cl",
        "the masked-sky pseudo-C_ell estimator on Gaussian realisations of a known spectrum, "
        "scalar and spin 2, full or flat sky: bias per bin against the bandpower windows, E "
        "to B leakage",
        bench_handlers.pseudo_cl,
        (
            arg("--nside", type=int, default=64, help="HEALPix nside (default 64)"),
            arg("--realisations", type=int, default=100, help="realisations (default 100)"),
            arg(
                "--mask",
                default=None,
                help="a HEALPix mask (.npy or FITS) of that nside "
                "(default: a 20 deg band and ten 6 deg holes)",
            ),
            arg("--seed", type=int, default=1, help="seed of the realisations (default 1)"),
            arg(
                "--pixels",
                type=int,
                default=0,
                help="a flat-sky map of this many pixels per side over 10 deg instead "
                "(default: the full sky); --mask then a .npy image of that size",
            ),
            JSON,
        ),
    ),
    Command(
        "nuisances",
        "NLA alignments, a photo-z shift and baryonic feedback on paired maps in their "
        "resolved range against pyccl's Limber spectra, per seed",
        bench_handlers.nuisances,
        (
            arg("--particles", type=int, default=128, help="particles per side (default 128)"),
            arg("--pixels", type=int, default=256, help="flat-sky pixels per side (default 256)"),
            arg("--seeds", type=int, default=4, help="realisations (default 4)"),
            arg("--steps", type=int, default=16, help="PM steps from a=0.1 to a=1 (default 16)"),
            arg("--box", type=float, default=128.0, help="box size, Mpc/h (default 128)"),
            JSON,
        ),
    ),
    Command(
        "limber",
        "the convergence C_ell of fixed-amplitude runs, full and flat sky, one source and "
        "three tomographic bins, against pyccl's halofit Limber in their resolved ranges",
        bench_handlers.limber,
        (
            arg("--particles", type=int, default=64, help="particles per side (default 64)"),
            arg("--seeds", type=int, default=6, help="runs, seeds 0, 1, ... (default 6)"),
            arg("--steps", type=int, default=10, help="PM steps from a=0.1 to a=1 (default 10)"),
            arg("--nside", type=int, default=64, help="HEALPix nside of the maps (default 64)"),
            JSON,
        ),
    ),
    Command(
        "draws",
        "the seconds an extra draw of the lensing nuisances (lensing.draws) adds to the "
        "lensing and summaries stages, over those of the run without draws",
        bench_handlers.draws,
        (
            arg("--particles", type=int, default=32, help="particles per side (default 32)"),
            arg("--pixels", type=int, default=128, help="flat-sky pixels per side (default 128)"),
            arg("--nside", type=int, default=32, help="HEALPix nside (default 32)"),
            arg("--draws", type=int, default=8, help="draws of the second run (default 8)"),
            JSON,
        ),
    ),
    Command(
        "store",
        "write, read and verify a store of N^3 particles as the stages do: seconds, GB/s, "
        "files and bytes on disk",
        bench_handlers.store,
        (
            PARTICLES,
            arg(
                "--pdims",
                type=int,
                nargs=2,
                default=[1, 1],
                metavar=("PX", "PY"),
                help="device mesh (on CPU, as many XLA host devices)",
            ),
            arg("--repeat", type=int, default=3, help="stores written, best kept"),
            arg("--dir", type=Path, help="folder to write in (default: the temporary folder)"),
            JSON,
        ),
    ),
    Command(
        "scaling",
        "strong and weak scaling of one PM step and its parts (paint, FFT, read) over device "
        "counts, slabs and pencils: a table, JSON and a plot",
        bench_handlers.scaling,
        (
            arg(
                "--particles",
                type=int,
                required=True,
                help="particles per side, N (weak scaling: on the fewest devices)",
            ),
            arg(
                "--devices",
                type=int,
                nargs="+",
                default=[1, 2, 4, 8],
                help="device counts (default 1 2 4 8; with several processes, the "
                "multiples of their number); on CPU the processes ask XLA for them",
            ),
            arg(
                "--scaling",
                nargs="+",
                choices=["strong", "weak"],
                default=["strong", "weak"],
                help="which scalings (default both)",
            ),
            arg(
                "--decompositions",
                nargs="+",
                choices=["slab", "pencil"],
                default=["slab", "pencil"],
                help="which decompositions (default both)",
            ),
            OVERSAMPLE,
            arg("--halo", type=int, default=4, help="halo cells (default 4)"),
            arg("--repeat", type=int, default=3, help="timed calls per part, best kept"),
            arg("--json", metavar="PATH", help="write the record to PATH"),
            arg("--plot", metavar="PNG", help="draw time and efficiency to PNG"),
            arg(
                "--trace",
                metavar="DIR",
                help="write a JAX profiler trace of PM steps on the most devices to DIR "
                "and print its time by category",
            ),
            arg("--trace-steps", type=int, default=3, help="steps traced (default 3)"),
        ),
    ),
    Command(
        "steps",
        "P(k) of S steps equal in a, ln a and D1 against a converged reference from the same ICs",
        bench_handlers.accuracy,
        (
            *ACCURACY,
            arg(
                "--reference-steps",
                type=int,
                default=128,
                help="steps (equal in ln a) of the reference",
            ),
            OVERSAMPLE,
        ),
    ),
    Command(
        "force",
        "P(k) of N particles with force meshes B = 1, 2, ... against 2N particles from the "
        "same large-scale modes and steps",
        bench_handlers.accuracy,
        (
            *ACCURACY,
            arg(
                "--oversamples",
                type=int,
                nargs="+",
                default=[1, 2],
                help="force meshes B to measure",
            ),
            arg(
                "--reference-oversample",
                type=int,
                default=2,
                help="force mesh B of the 2N-particle reference",
            ),
            arg(
                "--spacing", default="a", choices=STEP_SPACINGS, help="what the steps are equal in"
            ),
        ),
    ),
)
