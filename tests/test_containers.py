"""The Apptainer definition files (containers/): their sections, labels and environment, and
that the Python packages they install are exactly those of the lock's exports."""

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
import zarr
from conftest import REPO, RUN_FIGURES, TINY, golden, job_env, run_snakemake, same_store
from deffile import parse

from pmpipe import stages
from pmpipe.campaigns import campaign
from pmpipe.diagnostics import doctor
from pmpipe.storage import store

GOLDEN = Path(__file__).parent / "golden"
IMAGES = {"pmpipe-cpu.def": "run.txt", "pmpipe-gpu.def": "gpu-cuda13.txt"}  # definition: its export
VENV_PYTHON = "/opt/pmpipe/venv/bin/python"
SOURCE = "/opt/pmpipe/src"


def locked(export: str) -> dict[str, str]:
    """{name: version} of every package in a requirements/ export."""
    text = (REPO / "requirements" / export).read_text()
    return {
        m[1].lower(): m[2]
        for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==([^ ;]+)", text, re.MULTILINE)
    }


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_a_definition_has_every_section_and_copies_what_it_installs(name):
    definition = parse(REPO / "containers" / name)
    assert {"files", "post", "environment", "labels", "runscript", "test", "help"} <= set(
        definition.sections
    )
    files = dict(definition.files())
    export = f"requirements/{IMAGES[name]}"
    assert files == {
        "pyproject.toml": f"{SOURCE}/pyproject.toml",
        "README.md": f"{SOURCE}/README.md",
        "pmpipe": f"{SOURCE}/pmpipe",
        export: f"{SOURCE}/{export}",
    }
    assert all((REPO / source).exists() for source in files)


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_a_definition_installs_exactly_its_locked_export_then_pmpipe_alone(name):
    definition = parse(REPO / "containers" / name)
    pip = [cmd for cmd in definition.commands("post") if "pip" in cmd]
    assert pip == [
        [
            VENV_PYTHON,
            "-m",
            "pip",
            "install",
            "--no-cache-dir",
            "--require-hashes",
            "-r",
            f"{SOURCE}/requirements/{IMAGES[name]}",
        ],
        [VENV_PYTHON, "-m", "pip", "install", "--no-cache-dir", "--no-deps", SOURCE],
    ]
    assert ["python3", "-m", "venv", "/opt/pmpipe/venv"] in definition.commands("post")
    assert not re.search(r"\b(conda|mamba|uv pip|easy_install)\b", definition.sections["post"])
    assert (
        definition.sections["environment"]
        .strip()
        .startswith("export PATH=/opt/pmpipe/venv/bin:$PATH")
    )


def test_the_exports_give_each_image_what_it_runs_on():
    cpu, gpu, test = locked("run.txt"), locked("gpu-cuda13.txt"), locked("test.txt")
    assert {"jax", "jaxlib", "jaxdecomp", "zarr", "snakemake", "submitit"} <= set(cpu)
    assert not {"jax-cuda13-plugin", "mpi4py", "pytest"} & set(cpu)
    assert {"jax-cuda13-plugin", "nvidia-nccl-cu13", "mpi4py"} <= set(gpu)
    # one resolution: a package in two exports has one version
    for other in (gpu, test):
        assert {k: v for k, v in other.items() if k in cpu} == cpu


def test_the_cuda12_export_is_the_gpu_image_s_with_cuda_12_wheels():
    cuda12, cuda13 = locked("gpu-cuda12.txt"), locked("gpu-cuda13.txt")
    assert {"jax-cuda12-plugin", "nvidia-nccl-cu12", "mpi4py"} <= set(cuda12)
    assert not {n for n in cuda12 if "cu13" in n or "cuda13" in n}
    same = set(cuda12) & set(cuda13)
    assert {"jax", "jaxlib", "jaxdecomp", "mpi4py"} <= same
    assert {k: cuda12[k] for k in same} == {k: cuda13[k] for k in same}


def test_the_gpu_image_s_base_matches_the_locked_cuda_wheels():
    definition = parse(REPO / "containers" / "pmpipe-gpu.def")
    assert definition.header["Bootstrap"] == "docker"
    base = re.fullmatch(
        r"nvidia/cuda:(\d+)\.(\d+)\.\d+-base-ubuntu24\.04", definition.header["From"]
    )
    assert base, definition.header["From"]
    gpu = locked("gpu-cuda13.txt")
    runtime = gpu["nvidia-cuda-runtime"].split(".")
    assert [base[1], base[2]] == runtime[:2]
    assert f"jax-cuda{base[1]}-plugin" in gpu


def test_the_cpu_image_is_debootstrapped_debian_with_python():
    header = parse(REPO / "containers" / "pmpipe-cpu.def").header
    assert header["Bootstrap"] == "debootstrap" and header["OSVersion"] == "bookworm"
    assert {"python3", "python3-venv"} <= set(header["Include"].split())


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_a_definition_labels_its_version_and_commit_and_tests_itself(name):
    definition = parse(REPO / "containers" / name)
    labels = definition.labels()
    assert labels["org.opencontainers.image.title"] == name.removesuffix(".def")
    assert (
        labels["org.opencontainers.image.revision"] == "{{ commit }}"
    )  # apptainer build --build-arg
    assert (
        'echo "org.opencontainers.image.version $version" >> "$APPTAINER_LABELS"'
        in definition.sections["post"]
    )
    assert "python -m pmpipe.cli doctor --check" in definition.sections["test"]
    assert 'exec python -m pmpipe.cli "$@"' in definition.sections["runscript"]
    build = f"apptainer build --build-arg commit=$(git rev-parse HEAD) {name.removesuffix('.def')}.sif containers/{name}"
    assert build in (REPO / "containers" / name).read_text()
    assert build in (REPO / "containers" / "README.md").read_text()


def test_the_gpu_image_sets_one_process_per_gpu_defaults_and_site_library_binds():
    definition = parse(REPO / "containers" / "pmpipe-gpu.def")
    env = definition.sections["environment"]
    for default in (
        "XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-true}",
        "XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}",
        "NCCL_DEBUG=${NCCL_DEBUG:-WARN}",
        "LD_LIBRARY_PATH=/opt/site/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}",
    ):
        assert f"export {default}" in env
    assert ["mkdir", "-p", "/opt/site/lib"] in definition.commands("post")
    assert "openmpi-bin" in definition.sections["post"]  # MPI with PMIx for srun --mpi=pmix
    assert "/opt/site/lib" in (REPO / "containers" / "README.md").read_text()


def test_the_parser_rejects_what_apptainer_would(tmp_path):
    bad = tmp_path / "bad.def"
    bad.write_text("Bootstrap: docker\n%post\n  true\n%postt\n  true\n")
    with pytest.raises(ValueError, match="bad.def:4: unknown section %postt"):
        parse(bad)
    bad.write_text("Bootstrap docker\n")
    with pytest.raises(ValueError, match="bad.def:1: header lines"):
        parse(bad)


def dry_run_commands(workdir, campaign_file) -> str:
    """Rule, resources and shell command of every SLURM job of `snakemake --dry-run` through
    profiles/slurm-apptainer with the golden site, paths relative to ``workdir``."""
    out = run_snakemake(
        workdir,
        "--profile",
        str(REPO / "profiles/slurm-apptainer"),
        "--configfile",
        str(GOLDEN / "site_apptainer.yaml"),
        "--config",
        f"campaign={campaign_file}",
        "--dry-run",
        env={k: v for k, v in os.environ.items() if not k.startswith("PMPIPE_")},
        share_programs=False,
    )
    lines = [
        line.strip()
        for line in (out.stdout + out.stderr).splitlines()
        if line.startswith(("rule ", "    resources:", "Shell command:"))
    ]
    keep = [
        text
        for block in range(0, len(lines), 3)
        if lines[block].startswith("rule runs_")
        for text in lines[block : block + 3]
    ]  # the SLURM jobs (the other rules run in snakemake)
    return "\n".join(keep).replace(f"{workdir}/", "") + "\n"


def test_the_slurm_apptainer_profile_s_commands_match_golden(tmp_path):
    """Packed single-process CPU jobs run `env <site env> apptainer exec <image> python ...` in
    the batch step; a 2-node x 4-GPU stage runs `srun <geometry> env <site env> apptainer exec
    --nv <image> python ...`."""
    shutil.copy(REPO / "config" / "quickstart.yaml", tmp_path)
    shutil.copy(GOLDEN / "campaign_2x4.yaml", tmp_path)
    text = "".join(
        f"# {name}\n{dry_run_commands(tmp_path, name)}"
        for name in ("quickstart.yaml", "campaign_2x4.yaml")
    )
    golden(GOLDEN / "slurm_apptainer_commands.txt", text)
    assert (
        "srun --nodes=2 --ntasks-per-node=4 --cpus-per-task=8 --gres=gpu:4 --kill-on-bad-exit=1 "
        "env NCCL_DEBUG=WARN NCCL_NET_GDR_LEVEL=PHB apptainer exec --nv --bind=/scratch --bind=/opt/aws-ofi-nccl/lib:/opt/site/lib "
        "/images/pmpipe-gpu.sif python -m pmpipe.job.pipeline" in text
    )


# Session fixtures, made by each worker that needs them (the image is built once, by
# tests/provision.py or the first worker that asks), so that the tests that need no SLURM run
# beside the SLURM worker's
@pytest.fixture(scope="session")
def apptainer(tmp_path_factory):
    """A command that runs apptainer (tests/apptainer_image.py, provisioned by
    tests/provision.py). Skips with what is missing where it cannot run; under CI=true that
    fails."""
    import apptainer_image

    command, problem = apptainer_image.find(tmp_path_factory.mktemp("apptainer"))
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    return command


@pytest.fixture(scope="session")
def cpu_image(apptainer):
    """containers/pmpipe-cpu.def built as a sandbox without %post, labelled with HEAD (built
    by tests/provision.py, or by the first test that needs it)."""
    import apptainer_image

    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout.strip()
    return apptainer_image.cpu_image(apptainer, commit), commit


def in_image(apptainer, image, *args, cwd, env=None, timeout=600):
    """`apptainer exec --userns <image> ARGS` (this machine grants no CAP_SYS_RESOURCE)."""
    env = job_env(env or os.environ)
    return subprocess.run(
        [*apptainer, "exec", "--userns", str(image), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
def test_the_cpu_image_passes_its_test_and_doctor_reports_it_with_its_labels(
    apptainer, cpu_image, tmp_path
):
    image, commit = cpu_image
    done = subprocess.run(
        [*apptainer, "test", "--userns", str(image)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "a distributed FFT on 2 local devices agrees with numpy's" in done.stderr
    done = in_image(apptainer, image, "pmpipe", "doctor", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    facts = json.loads(done.stdout)
    assert set(doctor.FIELDS) <= set(facts)
    assert facts["container"]["inside"] and facts["container"]["image"] == str(image)
    labels = facts["container"]["labels"]
    assert labels["org.opencontainers.image.revision"] == commit
    assert labels["org.opencontainers.image.version"] == importlib.metadata.version("pmpipe")
    assert facts["python"]["executable"].startswith("/opt/pmpipe/venv/")
    assert facts["pmpipe"]["package"].startswith("/opt/pmpipe/venv/")  # the image's pmpipe


@pytest.mark.slow
def test_a_run_s_stages_in_the_image_equal_the_host_s(apptainer, cpu_image, tiny_local, tmp_path):
    """Every stage of one run by `apptainer exec <image> python -m pmpipe.job.pipeline`."""
    image, commit = cpu_image
    (tmp_path / "tiny.yaml").write_text(TINY)
    campaign.write_run_files(campaign.load(tmp_path / "tiny.yaml"), tmp_path / "results")
    run = "tiny-fiducial-r0"
    done = in_image(
        apptainer,
        image,
        "python",
        "-m",
        "pmpipe.job.pipeline",
        f"results/tiny/{run}/config.json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for stage in stages.STAGES:
        path = tmp_path / "results" / "tiny" / run / f"{stage}.zarr"
        assert store.is_complete(path), path
        same_store(tiny_local / "results" / "tiny" / run / f"{stage}.zarr", path)
    attrs = zarr.open_group(tmp_path / "results" / "tiny" / run / "ic.zarr", mode="r").attrs
    assert attrs["image"] == str(image) and attrs["git_commit"] == commit  # the image's label


def write_small_quickstart(workdir) -> None:
    """The quick-start campaign as quickstart.yaml in ``workdir``, 2 processes per stage, one
    realisation per point, 32^3 particles and a force mesh of B = 1 to keep CI short."""
    from test_slurm import two_processes_per_run

    data = yaml.safe_load((REPO / "config/quickstart.yaml").read_text())
    data["realisations"] = 1
    data["base"]["box"].update(particles=32, oversample=1)
    (workdir / "quickstart.yaml").write_text(two_processes_per_run(yaml.safe_dump(data)))


def small_quickstart_stores(results) -> dict:
    """Root attributes of every store of the small quick start, by path; asserts that its 3
    runs are complete, their N-body written by 2 processes, and the campaign's outputs made."""
    runs = sorted(p.parent.name for p in results.glob("*/config.json"))
    assert len(runs) == 3
    attrs = {}
    for run in runs:
        for stage in stages.STAGES:
            path = results / run / f"{stage}.zarr"
            assert store.is_complete(path), path
            attrs[path] = dict(zarr.open_group(path, mode="r").attrs)
        assert attrs[results / run / "nbody.zarr"]["process_count"] == 2  # an srun step of 2
    assert "process 1 of 2 (slurm)" in (results / "logs" / "job0000.log").read_text()
    assert (results / "summaries.zarr").exists() and (results / "report" / "peaks.png").exists()
    return attrs


@pytest.mark.slow
def test_the_quickstart_completes_through_the_slurm_apptainer_profile_then_does_nothing(
    slurm, apptainer, cpu_image, tmp_path
):
    """profiles/slurm-apptainer on the test cluster with the CPU image: the quick start (one
    realisation per point, 32^3 particles, B = 1) in one packed job whose srun step starts 2
    processes, each in the image, that meet through jax.distributed and use the persistent
    compilation cache the workflow passes them (the session's): every program the job compiles
    is written to it, or found there; a second invocation submits nothing. The runs' figures
    are left out (the tiny workflow's test reads them)."""
    from test_slurm import STATUS_CHECKS, job_count, slurm_env

    image, commit = cpu_image
    write_small_quickstart(tmp_path)
    (tmp_path / "site.yaml").write_text(
        yaml.safe_dump(
            {
                "site": {
                    "image": str(image),
                    "apptainer": apptainer[0],
                    "apptainer_options": ["--userns"],
                }
            }
        )
    )

    def snakemake():
        return run_snakemake(
            tmp_path,
            "--profile",
            str(REPO / "profiles/slurm-apptainer"),
            "--configfile",
            str(tmp_path / "site.yaml"),
            "--config",
            "campaign=quickstart.yaml",
            *STATUS_CHECKS,
            "--omit-from",  # the runs' figures: drawn by the tiny workflow's test
            RUN_FIGURES,
            env=slurm_env(),
            timeout=1200,
            main=REPO / "tests" / "slurm_snakemake.py",  # status every 2 s
        )

    out = snakemake()
    assert (
        f"srun --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --kill-on-bad-exit=1 "
        f"{apptainer[0]} exec --userns {image} python -m pmpipe.job.pipeline"
    ) in out.stdout + out.stderr
    results = tmp_path / "results" / "quickstart"
    attrs = small_quickstart_stores(results)
    assert {(a["image"], a["git_commit"]) for a in attrs.values()} == {(str(image), commit)}
    log = (results / "logs" / "job0000.log").read_text()  # the 3 runs packed into one job
    assert "process 1 of 2 (slurm): 1 local of 2 devices" in log
    assert log.count("ic, nbody, lensing, summaries done") == 3
    programs = [  # per stage of each run: compiled, written to the cache, found there
        tuple(map(int, found))
        for found in re.findall(
            r"programs: (\d+) compiled \((\d+) written to the persistent cache\), (\d+) from", log
        )
    ]
    assert programs and all(compiled == written for compiled, written, _ in programs), programs
    assert sum(written + hits for _, written, hits in programs) > 0, programs
    before = job_count()
    again = snakemake()
    assert "Nothing to be done" in again.stdout + again.stderr
    assert job_count() == before


def test_the_gpu_image_builds_jaxdecomp_from_its_locked_source_on_aarch64():
    """On aarch64 the GPU definition installs what building jaxdecomp's source distribution
    needs, and the export pins that source distribution's hash (the lock's sdist)."""
    post = parse(REPO / "containers" / "pmpipe-gpu.def").commands("post")
    assert [
        "[",
        "$(uname -m)",
        "!=",
        "aarch64",
        "]",
        "||",
        "apt-get",
        "install",
        "-y",
        "--no-install-recommends",
        "g++",
        "cmake",
        "python3-dev",
    ] in post
    lock = (REPO / "uv.lock").read_text()
    package = lock[lock.index('name = "jaxdecomp"') :]
    sdist_hash = re.search(r'sdist = \{[^}]*hash = "sha256:([0-9a-f]+)"', package)[1]
    export = (REPO / "requirements" / "gpu-cuda13.txt").read_text()
    entry = export[export.index("jaxdecomp==") :].split("# via")[0]
    assert f"--hash=sha256:{sdist_hash}" in entry and "aarch64" in entry


TIME_LIMITED = {
    "name": "limit",
    "seed": 3,
    "base": {
        "box": {"box_size": 128.0, "particles": 64, "oversample": 2},
        # 400 steps: 16 s of PM steps on an idle fast core, so that the N-body is still
        # evolving when pmpipe signals itself 20 s into the job, about 10 s after it started
        "nbody": {"steps": 400},
        "parallel": {"pdims": [1, 1]},
        "checkpoints": {"every_steps": 50},
    },
    "design": {"kind": "fiducial"},
    "execution": {
        "platform": "cpu",
        "devices_per_node": 1,
        "processes_per_node": 1,
        "cpus_per_task": 1,
        "device_memory_gb": 2,
    },
}


@pytest.mark.slow
def test_a_containerised_single_process_job_checkpoints_before_its_time_limit_and_is_requeued(
    slurm, apptainer, cpu_image, tmp_path
):
    """What the slurm-apptainer profile's rule runs for a single-process job, submitted with a
    1-minute limit: `python -m pmpipe.runtime.host_requeue -- apptainer exec <image> python -m
    pmpipe.job.pipeline --stop-ahead 40 CONFIG`. The image has no squeue or scontrol; the host
    side passes the job's end time in, pmpipe in the image signals itself 40 s before the
    limit, writes an N-body checkpoint and exits 3, the host side requeues the job, and the
    requeued job resumes from the checkpoint and completes the run (after more requeues, on a
    slower machine)."""
    from test_preemption import _release_when_requeued
    from test_slurm import slurm_env

    image, _ = cpu_image
    no_client = in_image(
        apptainer, image, "sh", "-c", "command -v squeue || command -v scontrol", cwd=tmp_path
    )
    assert no_client.returncode != 0, no_client.stdout
    (tmp_path / "limit.yaml").write_text(yaml.safe_dump(TIME_LIMITED))
    campaign.write_run_files(campaign.load(tmp_path / "limit.yaml"), tmp_path / "results")
    run_dir = tmp_path / "results" / "limit" / "limit-fiducial-r0"
    command = [sys.executable, "-m", "pmpipe.runtime.host_requeue", "--", *apptainer, "exec"]
    command += ["--userns", str(image), "python", "-m", "pmpipe.job.pipeline"]
    command += ["--stop-ahead", "40", str(run_dir / "config.json")]
    log = tmp_path / "job.log"
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--time=1", "--requeue", "--open-mode=append"]
        + [f"--output={log}", f"--wrap={shlex.join(command)}"],
        cwd=tmp_path,
        env=job_env(slurm_env()),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    job = submitted.stdout.strip().split(";")[0]
    end = time.monotonic() + 480
    while time.monotonic() < end and not store.is_complete(run_dir / "summaries.zarr"):
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True, check=False
        ).stdout.split()
        if state == ["PENDING", "BeginTime"]:  # requeued: held about 2 minutes unless released
            _release_when_requeued(job, timeout=60)
        time.sleep(1)
    text = log.read_text()
    for stage in ("ic", "nbody", "summaries"):
        assert store.is_complete(run_dir / f"{stage}.zarr"), (stage, text[-4000:])
    assert "SIGUSR2" in text and "no scontrol here" in text, text[-4000:]
    assert f"SLURM job {job} requeued" in text, text[-4000:]
    assert "resumed after step" in text, text[-4000:]
