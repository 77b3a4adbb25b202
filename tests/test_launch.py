"""SLURM job builders (pure functions) against golden files; site settings from file and
environment; `pmpipe submit --dry-run`."""

import math
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import golden

from pmpipe.campaigns import campaign, resources
from pmpipe.cluster import launch, site
from pmpipe.run import config
from pmpipe.runtime import host_requeue, parallel, slurm_job

GOLDEN = Path(__file__).parent / "golden"
LOGS = "/scratch/pmpipe/logs"


def _nbody_job():
    camp = campaign.load(GOLDEN / "campaign_2x4.yaml")
    spec = campaign.expand(camp)[0]
    return (
        camp,
        spec,
        launch.campaign_job(camp, spec, site.load_site(GOLDEN / "site.yaml", {}), "nbody"),
    )


def test_sbatch_script_of_a_2_node_4_gpu_nbody_stage_matches_golden():
    camp, spec, job = _nbody_job()
    res = resources.resources(spec.run, "nbody", camp.execution)
    script = launch.sbatch_script(job, LOGS)
    golden(GOLDEN / "sbatch_nbody_2x4.sh", script)
    lines = script.splitlines()
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --cpus-per-task=8",
        f"#SBATCH --mem={res['mem_mb']}M",
        f"#SBATCH --time={res['runtime']}",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=cosmo",
        "#SBATCH --qos=normal",
        "#SBATCH --constraint=a100",
        "#SBATCH --exclusive",
        f"#SBATCH --output={LOGS}/%j_0_log.out",
        "#SBATCH --signal=USR2@150",
    ):  # the site's 300 s, at most a quarter of 10 min
        assert line in lines, line
    assert res["mem_mb"] > 4 * 1000 and res["runtime"] >= resources.MIN_RUNTIME_MINUTES
    srun = [line for line in lines if line.startswith("srun ")]
    assert srun == [
        (
            f"srun --unbuffered --output {LOGS}/%j_%t_log.out --kill-on-bad-exit=1 "
            f"python -u -m submitit.core._submit {LOGS}"
        )
    ]


def test_array_script_runs_groups_of_runs_with_bounded_parallelism():
    camp = campaign.load(GOLDEN / "campaign_2x4.yaml").model_copy(update={"realisations": 5})
    specs = campaign.expand(camp)
    groups = list(campaign.job_groups(specs, 2).values())
    assert [[s.index for s in g] for g in groups] == [[0, 1], [2, 3], [4]]
    job = launch.array_job(camp, groups, None)
    est = resources.estimate(specs[0].run, camp.execution)
    work = sum(t - resources.STARTUP_SECONDS for s, t in est.runtime_s.items() if s != "lensing")
    expected = (resources.STARTUP_SECONDS + 2 * work) * camp.execution.runtime_safety / 60
    assert job.time_min == max(resources.MIN_RUNTIME_MINUTES, math.ceil(expected))
    per_stage = [
        resources.resources(specs[0].run, s, camp.execution) for s in ("ic", "nbody", "summaries")
    ]
    assert job.mem_mb == max(r["mem_mb"] for r in per_stage)
    script = launch.sbatch_script(job, LOGS, array_size=3, array_parallelism=2)
    assert "#SBATCH --array=0-2%2" in script.splitlines()
    assert "#SBATCH --partition" not in script  # no site: SLURM's defaults


def test_snakemake_resources_and_srun_line_of_a_multi_node_stage():
    camp, spec, job = _nbody_job()
    res = launch.snakemake_resources(job)
    assert res["nodes"] == 2 and res["tasks_per_node"] == 4 and res["cpus_per_task"] == 8
    assert res["gres"] == "gpu:4" and "gpu" not in res  # gpu would become --gpus, a job total
    assert shlex.split(res["mpi"]) == [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=4",
        "--cpus-per-task=8",
        "--gres=gpu:4",
        "--kill-on-bad-exit=1",
    ]
    assert res["slurm_partition"] == "gpu" and res["slurm_account"] == "cosmo"
    assert res["qos"] == "normal" and res["constraint"] == "a100"
    assert res["slurm_extra"] == "--exclusive --signal=USR2@150"  # the site's, then the signal
    one = launch.job_resources(
        [spec.run.model_copy(update={"parallel": config.Parallel()})],
        camp.execution,
        site.Site(signal_seconds=60),
    )
    assert one["mpi"] == "" and one["tasks_per_node"] == 1 and "slurm_partition" not in one
    assert one["slurm_extra"] == "--signal=USR2@60"
    local = launch.job_resources([spec.run], camp.execution, None)
    assert local["mpi"] == "" and local["gpu"] == 4
    # SLURM signals srun steps itself; a single process runs in the batch step and stops itself
    assert launch.stop_ahead(res, site.Site()) == 0
    assert launch.stop_ahead(one, site.Site(signal_seconds=60)) == 60
    assert launch.stop_ahead(one, site.Site(signal_seconds=10_000)) == one["runtime"] * 60 // 4
    assert launch.stop_ahead(local, None) == 0


def test_one_process_per_node_drives_all_its_gpus():
    camp, spec, _ = _nbody_job()
    per_node = camp.model_copy(
        update={"execution": camp.execution.model_copy(update={"processes_per_node": 1})}
    )
    job = launch.campaign_job(per_node, spec, site.Site(), "nbody")
    assert shlex.split(launch.snakemake_resources(job)["mpi"]) == [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=8",
        "--gres=gpu:4",
        "--kill-on-bad-exit=1",
    ]


def test_slurm_durations_and_the_job_of_this_process():
    assert slurm_job.slurm_seconds("9:05") == 545
    assert slurm_job.slurm_seconds("1:00:00\n") == 3600
    assert slurm_job.slurm_seconds("2-03:04:05") == 2 * 86400 + 3 * 3600 + 4 * 60 + 5
    for text in ("UNLIMITED", "NOT_SET", "INVALID", "", "5", "1:x:00", "a-1:00:00"):
        assert slurm_job.slurm_seconds(text) is None, text
    assert slurm_job.this_job({"SLURM_JOB_ID": "12"}) == "12"
    assert (
        slurm_job.this_job(
            {"SLURM_JOB_ID": "14", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "2"}
        )
        == "12_2"
    )
    assert slurm_job.this_job({}) is None and slurm_job.time_left({}) is None
    assert slurm_job.signal_before_time_limit(60, {}) is None  # outside a SLURM job: no signal


def test_the_time_left_comes_from_the_job_s_end_time_where_it_is_given():
    job = {"SLURM_JOB_ID": "12", "SLURM_JOB_END_TIME": "1000"}
    assert slurm_job.time_left(job, now=900) == 100
    assert slurm_job.time_left(job, now=1100) == 0
    assert slurm_job.time_left({**job, "SLURM_JOB_ID": ""}, now=900) is None  # no job
    assert host_requeue.job_environment(job) == job  # SLURM's own end time is kept
    assert "SLURM_JOB_END_TIME" not in host_requeue.job_environment({"PATH": "/bin"})


def test_a_process_without_scontrol_asks_the_host_side_to_requeue_its_job(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol
    ask = tmp_path / "ask"
    job = {"SLURM_JOB_ID": "7", slurm_job.REQUEUE_FILE_VARIABLE: str(ask)}
    ok, text = slurm_job.requeue_this_job(job)
    assert not ok and "host side (pmpipe.runtime.host_requeue) requeues it" in text
    assert ask.read_text() == "7\n"
    ok, text = slurm_job.requeue_this_job({"SLURM_JOB_ID": "7"})
    assert not ok and text.startswith("SLURM job 7 could not be requeued: scontrol")


def test_the_host_side_passes_signals_in_and_returns_the_command_s_status(tmp_path):
    """Outside a SLURM job: the command's status (a stopped one's 3 too, with no job to
    requeue), SIGUSR2 to the host side reaching the command."""
    stops_on_usr2 = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR2, lambda *a: sys.exit(3))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    host = [sys.executable, "-m", "pmpipe.runtime.host_requeue", "--", sys.executable, "-c"]
    proc = subprocess.Popen(
        [*host, stops_on_usr2], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=30) == 3, proc.stderr.read()
    done = subprocess.run([*host, "raise SystemExit(5)"], env=env, timeout=60, check=False)
    assert done.returncode == 5
    asks = "import os; open(os.environ['PMPIPE_REQUEUE_FILE'], 'w').write('7'); raise SystemExit(3)"
    done = subprocess.run([*host, asks], env=env, cwd=tmp_path, timeout=60, check=False)
    assert done.returncode == 3 and not list(
        tmp_path.glob(".pmpipe-requeue-*")
    )  # no job: no requeue
    usage = subprocess.run(host[:4], env=env, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "give the command after --" in usage.stderr


def test_site_gpus_per_node_replaces_the_campaign_s():
    camp, spec, _ = _nbody_job()
    eight = site.Site(gpus_per_node=8)
    job = launch.campaign_job(camp, spec, eight, "nbody")
    assert (job.nodes, job.tasks_per_node, job.gpus_per_node) == (1, 8, 8)


def test_site_settings_from_file_and_environment(tmp_path):
    s = site.load_site(
        GOLDEN / "site.yaml",
        {"PMPIPE_SLURM_PARTITION": "debug", "PMPIPE_SLURM_EXTRA": "--exclusive --reservation=x"},
    )
    assert (
        s.partition == "debug"
        and s.account == "cosmo"
        and s.extra == ["--exclusive", "--reservation=x"]
    )
    assert site.load_site(tmp_path / "absent.yaml", {}) == site.Site()
    with pytest.raises(config.ConfigError, match="PMPIPE_SITE=.*no such site file"):
        site.load_site(None, {"PMPIPE_SITE": str(tmp_path / "absent.yaml")})
    with pytest.raises(config.ConfigError, match=r"PMPIPE_SLURM_GPUS_PER_NODE[\s\S]*gpus_per_node"):
        site.load_site(None, {"PMPIPE_SLURM_GPUS_PER_NODE": "zero"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("site: {partition: gpu, nodes: 3}\n")
    with pytest.raises(config.ConfigError, match=r"bad.yaml.*site.nodes|bad.yaml[\s\S]*nodes"):
        site.load_site(bad, {})
    bad.write_text("partition: gpu\n")
    with pytest.raises(config.ConfigError, match="one top-level key, 'site'"):
        site.load_site(bad, {})
    with pytest.raises(config.ConfigError, match="--key=value"):
        launch.submitit_parameters(launch.SlurmJob("x", 1, 1, 1, 0, 1000, 10, extra=("exclusive",)))


def test_submit_dry_run_prints_the_script_of_the_builder(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMPIPE_")}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pmpipe.cli",
            "submit",
            str(GOLDEN / "campaign_2x4.yaml"),
            "--site",
            str(GOLDEN / "site.yaml"),
            "--stage",
            "nbody",
            "--logs",
            LOGS,
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    _, _, job = _nbody_job()
    assert out.stdout.strip() == launch.sbatch_script(job, LOGS, python=sys.executable).strip()
    assert not (tmp_path / "results").exists()  # a dry run writes nothing
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "pmpipe.cli",
            "submit",
            str(GOLDEN / "campaign_2x4.yaml"),
            "--run",
            "nope",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and "--run nope: not a run of" in bad.stderr


def test_a_site_image_wraps_the_python_of_every_job(tmp_path):
    """`[srun <geometry>] [env NAME=value ...] apptainer exec [--nv] <options> <image> python`:
    --nv for GPU jobs, the image and command from the site file or PMPIPE_IMAGE /
    PMPIPE_APPTAINER, the site's environment variables in front."""
    assert (
        launch.wrapper_command(None, True) == [] and launch.wrapper_command(site.Site(), True) == []
    )
    s = site.load_site(GOLDEN / "site_apptainer.yaml", {"PMPIPE_APPTAINER": "singularity --silent"})
    assert s.image == "/images/pmpipe-gpu.sif"
    assert launch.wrapper_command(s, gpus=True) == [
        "env",
        "NCCL_DEBUG=WARN",
        "NCCL_NET_GDR_LEVEL=PHB",
        "singularity",
        "--silent",
        "exec",
        "--nv",
        "--bind=/scratch",
        "--bind=/opt/aws-ofi-nccl/lib:/opt/site/lib",
        "/images/pmpipe-gpu.sif",
    ]
    assert "--nv" not in launch.wrapper_command(s, gpus=False)
    _, _, job = _nbody_job()
    assert launch.job_python(job, None) is None and launch.job_python(job, site.Site()) is None
    assert launch.job_python(job, s) == (
        "env NCCL_DEBUG=WARN NCCL_NET_GDR_LEVEL=PHB singularity --silent exec --nv --bind=/scratch "
        "--bind=/opt/aws-ofi-nccl/lib:/opt/site/lib /images/pmpipe-gpu.sif python"
    )
    bare = site.Site(env={"XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true"})
    assert launch.job_python(job, bare) == shlex.join(
        ["env", "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true", sys.executable]
    )
    with pytest.raises(config.ConfigError, match="env"):
        site.from_mapping({"env": {"NOT A NAME": "1"}}, {}, "site.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PMPIPE_")}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pmpipe.cli",
            "submit",
            str(GOLDEN / "campaign_2x4.yaml"),
            "--site",
            str(GOLDEN / "site_apptainer.yaml"),
            "--stage",
            "nbody",
            "--logs",
            LOGS,
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        env={**env, "PMPIPE_IMAGE": "/other/pmpipe.sif"},
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert (
        f"srun --unbuffered --output {LOGS}/%j_%t_log.out --kill-on-bad-exit=1 env NCCL_DEBUG=WARN "
        "NCCL_NET_GDR_LEVEL=PHB apptainer exec --nv "
        "--bind=/scratch --bind=/opt/aws-ofi-nccl/lib:/opt/site/lib /other/pmpipe.sif python -u -m "
        f"submitit.core._submit {LOGS}\n"
    ) in out.stdout


@pytest.mark.parametrize(
    "per_process, environ, expected",
    [
        # srun --ntasks-per-node=4 --gres=gpu:4: every task sees the node's 4 GPUs
        (
            1,
            {
                "SLURM_LOCALID": "2",
                "SLURM_STEP_TASKS_PER_NODE": "4",
                "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            },
            [2],
        ),
        # srun --ntasks-per-node=2 --gres=gpu:4: two GPUs each, all four visible to both
        (
            2,
            {
                "SLURM_LOCALID": "1",
                "SLURM_STEP_TASKS_PER_NODE": "2",
                "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            },
            [2, 3],
        ),
        # srun --ntasks-per-node=4 --gpus-per-task=1 (or --gpu-bind=single:1): each task sees its GPU
        (
            1,
            {"SLURM_LOCALID": "2", "SLURM_STEP_TASKS_PER_NODE": "4", "CUDA_VISIBLE_DEVICES": "2"},
            [0],
        ),
        (
            1,
            {
                "SLURM_LOCALID": "3",
                "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
                "ROCR_VISIBLE_DEVICES": "0",
            },
            [0],
        ),
        # srun --ntasks-per-node=2 --gpus-per-task=2: each task sees its two GPUs
        (
            2,
            {"SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2", "CUDA_VISIBLE_DEVICES": "2,3"},
            [0, 1],
        ),
        # srun --ntasks-per-node=1 --gres=gpu:4: one process drives every GPU of its node
        (
            4,
            {
                "SLURM_LOCALID": "0",
                "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
                "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            },
            [0, 1, 2, 3],
        ),
        (4, {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}, None),
        # mpiexec: the MPI library's local rank
        (1, {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, [1]),
        (1, {"MPI_LOCALRANKID": "1"}, [1]),
        (2, {"MPI_LOCALRANKID": "1"}, [2, 3]),
        (1, {}, None),
    ],
    ids=[
        "gres",
        "gres-two-each",
        "gpus-per-task",
        "gpus-per-task-rocm",
        "gpus-per-task-two",
        "one-per-node",
        "one-per-node-unset",
        "openmpi",
        "mpich",
        "mpich-two-each",
        "none",
    ],
)
def test_local_device_ids_follow_the_launcher_s_gpu_binding(per_process, environ, expected):
    assert parallel.local_device_ids(per_process, environ) == expected


@pytest.mark.parametrize(
    "platforms, plugins, files, expected",
    [
        ("", ["xla_cuda13"], ["/dev/nvidia0"], True),
        ("cuda,cpu", ["xla_cuda13"], ["/dev/nvidia0"], True),
        ("", ["xla_rocm7"], ["/dev/kfd"], True),
        ("cpu", ["xla_cuda13"], ["/dev/nvidia0"], False),  # JAX_PLATFORMS=cpu
        ("", [], ["/dev/nvidia0"], False),  # no GPU plugin installed
        ("", ["xla_cuda13"], [], False),  # a GPU image on a CPU node
    ],
    ids=["cuda", "cuda-listed", "rocm", "cpu-only", "no-plugin", "no-gpu"],
)
def test_the_platform_is_known_before_jax_starts(platforms, plugins, files, expected):
    """The CPU-only settings of several processes (gloo, synchronous dispatch) are set only
    when this is False."""
    assert parallel.gpu_platform(platforms, plugins, files) is expected


@pytest.mark.parametrize("returncode", [-signal.SIGTERM, 1])
def test_a_requeue_ended_by_slurm_s_own_sigterm_waits_for_the_end_of_the_job(
    monkeypatch, returncode
):
    """submitit's SIGUSR2 handler requeues the job with ``scontrol requeue``; SLURM, ending the
    job, may terminate that ``scontrol`` before it returns. The job then waits to be ended (no
    failure recorded); a requeue that failed otherwise is the job's error."""
    from pmpipe.storage import checkpoint

    def requeue(signum, frame):
        raise subprocess.CalledProcessError(returncode, ["scontrol", "requeue", "7"])

    def stopped():
        raise checkpoint.Preempted("stopped by a signal after step 3", signal.SIGUSR2)

    waits = []
    monkeypatch.setattr(launch.time, "sleep", waits.append)
    previous = signal.signal(signal.SIGUSR2, requeue)
    try:
        expected = checkpoint.Preempted if returncode < 0 else subprocess.CalledProcessError
        with pytest.raises(expected):
            launch.RunsJob(stopped)()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert waits == ([launch.RunsJob.TERM_WAIT_SECONDS] if returncode < 0 else [])
