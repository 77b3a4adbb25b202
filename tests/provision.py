"""What the tests run on that pip cannot install: a real SLURM (Debian's slurm-wlm, munge,
slurmdbd, mariadb-server) and Apptainer (Debian sid's, in a root made by debootstrap and
entered with bubblewrap: tests/apptainer_image.py), and the checkout's CPU image that the
container tests run (built here, on an idle machine, rather than by the first test that needs
it while the others compute). The README's test command runs this first, after installing the
test requirements with pip's --no-compile: their bytecode is compiled here, on every core
(pip compiles one file at a time: 58 s of the 101 s its install took on 2 cores, against 24 s
here; without bytecode every process the tests start would compile what it imports).

    python tests/provision.py

As root with apt-get it installs what is missing (about two minutes on a new machine);
otherwise it says what is missing and exits 0: the tests that need it then skip, naming it
(under CI=true they fail instead). Exit status 1 when an installation failed.
"""

from __future__ import annotations

import compileall
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import apptainer_image
import slurm_cluster


def apt_install(packages: list[str]) -> str | None:
    """apt-get install the packages; None when done, else why it failed."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
    done = subprocess.run(
        ["apt-get", "install", "-y", "-qq", *packages], env=env, capture_output=True, text=True
    )
    if done.returncode:
        return f"apt-get install {' '.join(packages)} failed: {done.stderr.strip()[-500:]}"
    return None


def build_image() -> str | None:
    """The checkout's CPU image for the tests (apptainer_image.cpu_image); None when it is
    there, else why it is not."""
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        cwd=apptainer_image.REPO,
        check=False,
    )
    if commit.returncode:
        return f"the CPU image needs the checkout's commit: {commit.stderr.strip()}"
    try:
        with tempfile.TemporaryDirectory() as folder:
            apptainer = apptainer_image.apptainer_command(Path(folder))
            apptainer_image.cpu_image(apptainer, commit.stdout.strip())
    except importlib.metadata.PackageNotFoundError:
        return "the CPU image needs pmpipe installed first (pip install --no-deps -e .)"
    except apptainer_image.Unavailable as err:
        return f"the CPU image: {err}"
    return None


def compile_packages() -> None:
    """Byte-compile this environment's installed packages on every core (files already compiled
    are left; files that are not Python 3, which some packages ship as data, are skipped, as
    pip skips them; so are the packages' own test folders, a third of the files, which no test
    imports)."""
    for folder in sorted({sysconfig.get_paths()[name] for name in ("purelib", "platlib")}):
        tests = re.compile(re.escape(folder) + r".*[/\\]tests?[/\\]")
        compileall.compile_dir(folder, quiet=2, workers=0, rx=tests)


def main() -> int:
    """Install what is missing where this process may; report what is still missing."""
    compile_packages()
    may_install = os.geteuid() == 0 and shutil.which("apt-get") is not None
    packages = list(slurm_cluster.PACKAGES) if slurm_cluster.missing_programs() else []
    packages += apptainer_image.missing_host_tools()
    failures = []
    if packages and may_install:
        failures.append(apt_install(packages))
    if may_install and not apptainer_image.APPTAINER_ROOT.is_dir():
        try:
            apptainer_image.provision_apptainer()
        except apptainer_image.Unavailable as err:
            failures.append(f"Apptainer's root: {err}")
    if may_install and apptainer_image.APPTAINER_ROOT.is_dir():
        failures.append(build_image())
    failures = [f for f in failures if f]
    missing = [slurm_cluster.missing()]
    if not apptainer_image.APPTAINER_ROOT.is_dir() or apptainer_image.missing_host_tools():
        missing.append(
            "Apptainer for the tests: "
            + " and ".join(apptainer_image.missing_host_tools() + ["its Debian sid root"])
        )
    for line in failures + [m for m in missing if m]:
        print(f"provision: {line}", file=sys.stderr)
    if not any(missing):
        print("provision: SLURM and Apptainer for the tests are in place")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
