"""A real one-node SLURM cluster on localhost for pmpipe's tests, with accounting and 2 fake GPUs.

    python tests/slurm_cluster.py start [--state DIR]   # start (tests/provision.py installs it)
    python tests/slurm_cluster.py stop  [--state DIR]   # stop exactly the daemons it started

Daemons: munged (only when no munge answers already), mariadbd (its own data directory and
port, loopback), slurmdbd, slurmctld and slurmd, all in the foreground of background processes
whose PIDs are kept in ``<state>/pids.json``. The partition is ``pmpipe``, the account
``pmpipe``. GPUs are gres entries backed by links to /dev/null (no device is touched).

``srun`` inside a Snakemake job step finds no ``SLURM_CONF`` (the jobstep drops every SLURM_*
variable), so the configuration is written to /etc/slurm, marked as written by this script;
a configuration there that this script did not write is never touched. Debian bookworm's
``slurm-wlm`` 22.05 is the SLURM it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge", "slurmdbd", "mariadb-server")
PROGRAMS = (
    "munged",
    "munge",
    "mariadbd",
    "mariadb-install-db",
    "mariadb",
    "slurmdbd",
    "slurmctld",
    "slurmd",
    "sacctmgr",
    "sbatch",
    "srun",
    "sacct",
    "squeue",
)
CONF_DIR = Path("/etc/slurm")
MARK = "# written by pmpipe tests/slurm_cluster.py"
MUNGE_SOCKET_DIR = Path("/run/munge")
CLUSTER = "pmpipe"
PARTITION = "pmpipe"
ACCOUNT = "pmpipe"
GPUS = 2
CPUS = 8  # declared CPUs, more than the cores: four 2-process jobs at once (docs/slurm.md)
DEFAULT_STATE = Path(tempfile.gettempdir()) / "pmpipe-slurm"


def missing_programs() -> list[str]:
    """Programs of the cluster that are not on PATH (nor in /usr/sbin)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    return [p for p in PROGRAMS if shutil.which(p, path=path) is None]


def missing() -> str | None:
    """None when every program of the cluster is there, else what is missing."""
    lacking = missing_programs()
    if not lacking:
        return None
    return (
        f"the SLURM test cluster needs {', '.join(lacking)} (Debian packages "
        f"{' '.join(PACKAGES)}): run `python tests/provision.py` as root"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_name() -> str:
    return socket.gethostname().split(".")[0]


def slurm_conf(state: Path, ports: dict, cpus: int, memory_mb: int) -> str:
    """slurm.conf of the one-node cluster (pure function of its arguments)."""
    node = node_name()
    return "\n".join(
        [
            MARK,
            f"ClusterName={CLUSTER}",
            f"SlurmctldHost={node}(127.0.0.1)",
            f"SlurmctldPort={ports['slurmctld']}",
            f"SlurmdPort={ports['slurmd']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"StateSaveLocation={state}/ctld",
            f"SlurmdSpoolDir={state}/d",
            f"SlurmctldPidFile={state}/slurmctld.pid",
            f"SlurmdPidFile={state}/slurmd.pid",
            f"SlurmctldLogFile={state}/slurmctld.log",
            f"SlurmdLogFile={state}/slurmd.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SlurmdParameters=config_overrides",  # CPUs below: more than the cores, see CPUS
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "GresTypes=gpu",
            "MinJobAge=600",
            "KillWait=5",
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={ports['slurmdbd']}",
            "AccountingStorageTRES=gres/gpu",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            (
                f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} "
                f"Gres=gpu:{GPUS} State=UNKNOWN"
            ),
            f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def gres_conf(state: Path) -> str:
    """gres.conf: GPUs backed by links to /dev/null, no autodetection."""
    return f"{MARK}\nAutoDetect=off\nName=gpu File={state}/fakegpu[0-{GPUS - 1}]\n"


def slurmdbd_conf(state: Path, ports: dict) -> str:
    """slurmdbd.conf: accounting in the cluster's own MariaDB over loopback TCP."""
    return "\n".join(
        [
            MARK,
            "AuthType=auth/munge",
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            f"DbdPort={ports['slurmdbd']}",
            "SlurmUser=root",
            f"PidFile={state}/slurmdbd.pid",
            f"LogFile={state}/slurmdbd.log",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={ports['mariadb']}",
            "StorageUser=root",
            "StorageLoc=pmpipe_slurm_acct",
            "",
        ]
    )


def _ours(path: Path) -> bool:
    return path.exists() and path.read_text().startswith(MARK)


def _memory_mb() -> int:
    with open("/proc/meminfo") as f:
        total_kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    return int(total_kb / 1024 * 0.8)


def _wait(check, what: str, log: Path | None, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.3)
    tail = log.read_text()[-2000:] if log and log.exists() else ""
    raise RuntimeError(f"SLURM test cluster: {what} did not come up in {timeout:.0f} s\n{tail}")


def _ok(*cmd: str) -> bool:
    return subprocess.run(cmd, capture_output=True).returncode == 0


class Cluster:
    """Start and stop the cluster's daemons; state (configs, logs, PIDs) under ``state``."""

    def __init__(self, state: Path = DEFAULT_STATE):
        self.state = Path(state)
        self.pids_file = self.state / "pids.json"

    def _pids(self) -> dict:
        return json.loads(self.pids_file.read_text()) if self.pids_file.exists() else {}

    def _spawn(self, name: str, cmd: list[str], **kw) -> None:
        with open(self.state / f"{name}.out", "ab") as log:  # the daemon keeps its own copy
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **kw,
            )
        pids = self._pids()
        pids[name] = proc.pid
        self.pids_file.write_text(json.dumps(pids))

    def running(self) -> bool:
        return bool(self._pids()) and _ok("sinfo", "-h")

    def start(self) -> None:
        """Start every daemon; raises RuntimeError (with the daemon's log) when one fails."""
        for name in ("slurm.conf", "gres.conf", "slurmdbd.conf"):
            path = CONF_DIR / name
            if path.exists() and not _ours(path):
                raise RuntimeError(
                    f"{path} exists and was not written by {__file__}; "
                    "refusing to replace a real SLURM configuration"
                )
        if self._pids():
            self.stop()
        shutil.rmtree(self.state, ignore_errors=True)
        for sub in ("ctld", "d", "db"):
            (self.state / sub).mkdir(parents=True)
        for i in range(GPUS):
            (self.state / f"fakegpu{i}").symlink_to("/dev/null")
        ports = {name: free_port() for name in ("slurmctld", "slurmd", "slurmdbd", "mariadb")}
        try:
            self._start_munge()
            self._start_mariadb(ports["mariadb"])
            CONF_DIR.mkdir(parents=True, exist_ok=True)
            (CONF_DIR / "slurm.conf").write_text(
                slurm_conf(self.state, ports, max(CPUS, os.cpu_count() or 1), _memory_mb())
            )
            (CONF_DIR / "gres.conf").write_text(gres_conf(self.state))
            dbd = CONF_DIR / "slurmdbd.conf"
            dbd.write_text(slurmdbd_conf(self.state, ports))
            dbd.chmod(0o600)
            self._spawn("slurmdbd", ["slurmdbd", "-D"])
            _wait(
                lambda: _ok("sacctmgr", "-n", "list", "cluster"),
                "slurmdbd",
                self.state / "slurmdbd.log",
            )
            subprocess.run(["sacctmgr", "-i", "add", "cluster", CLUSTER], capture_output=True)
            subprocess.run(
                ["sacctmgr", "-i", "add", "account", ACCOUNT, f"cluster={CLUSTER}"],
                capture_output=True,
            )
            subprocess.run(
                [
                    "sacctmgr",
                    "-i",
                    "add",
                    "user",
                    "root",
                    f"account={ACCOUNT}",
                    f"cluster={CLUSTER}",
                    f"defaultaccount={ACCOUNT}",
                ],
                capture_output=True,
            )
            self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-i"])
            _wait(lambda: _ok("scontrol", "ping"), "slurmctld", self.state / "slurmctld.log")
            self._spawn("slurmd", ["slurmd", "-D", "-N", node_name()])
            _wait(self._node_idle, "slurmd (node idle)", self.state / "slurmd.log")
        except Exception:
            self.stop()
            raise

    def _node_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True)
        return out.stdout.strip() == "idle"

    def _start_munge(self) -> None:
        if _ok("sh", "-c", "munge -n | unmunge"):
            return  # a munge already answers: use it, leave it alone
        MUNGE_SOCKET_DIR.mkdir(parents=True, exist_ok=True)
        shutil.chown(MUNGE_SOCKET_DIR, "munge", "munge")
        MUNGE_SOCKET_DIR.chmod(0o755)
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True)
            shutil.chown(key, "munge", "munge")
        self._spawn("munged", ["munged", "-F", f"--log-file={self.state}/munged.log"], user="munge")
        _wait(
            lambda: _ok("sh", "-c", "munge -n | unmunge"),
            "munged",
            self.state / "munged.log",
            timeout=20,
        )

    def _start_mariadb(self, port: int) -> None:
        data = self.state / "db"
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
        )
        sock = self.state / "mariadb.sock"
        self._spawn(
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                f"--socket={sock}",
                f"--port={port}",
                "--bind-address=127.0.0.1",
                f"--pid-file={self.state}/mariadb.pid",
                "--innodb-buffer-pool-size=64M",
            ],
        )
        _wait(
            lambda: _ok("mariadb", "--no-defaults", f"--socket={sock}", "-uroot", "-e", "select 1"),
            "mariadbd",
            self.state / "mariadbd.out",
        )
        # slurmdbd connects over TCP as root from 127.0.0.1, without a password
        sql = (
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; "
            "GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; FLUSH PRIVILEGES;"
        )
        subprocess.run(
            ["mariadb", "--no-defaults", f"--socket={sock}", "-uroot", "-e", sql],
            check=True,
            capture_output=True,
        )

    def stop(self) -> None:
        """Stop the daemons this cluster started (by PID, reverse order) and remove its
        configuration files from /etc/slurm."""
        for name, pid in reversed(list(self._pids().items())):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                if _reaped(pid):
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
        if self.pids_file.exists():
            self.pids_file.unlink()
        for name in ("slurm.conf", "gres.conf", "slurmdbd.conf"):
            path = CONF_DIR / name
            if _ours(path):
                path.unlink()


def _reaped(pid: int) -> bool:
    """True when ``pid`` is a child of this process that has exited (and is now reaped)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument(
        "--state",
        type=Path,
        default=DEFAULT_STATE,
        help=f"folder of configs, logs and PIDs (default {DEFAULT_STATE})",
    )
    args = parser.parse_args(argv)
    cluster = Cluster(args.state)
    if args.action == "start":
        problem = missing()
        if problem:
            print(problem, file=sys.stderr)
            return 1
        cluster.start()
        print(
            f"SLURM cluster {CLUSTER!r} up: partition {PARTITION}, {GPUS} fake GPUs; "
            f"state in {args.state}"
        )
    elif args.action == "stop":
        cluster.stop()
    else:
        print("running" if cluster.running() else "not running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
