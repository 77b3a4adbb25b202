"""Apptainer on this machine for the tests, and pmpipe's CPU image built without ``%post``.

Apptainer is packaged neither in Debian bookworm nor on PyPI. The tests run the apptainer of
Debian sid from a root made with debootstrap, entered with bubblewrap (apptainer refuses to run
in a chroot; bubblewrap pivots into the root) with /tmp, $HOME and the repository bound at their
own paths. Apptainer as root asks for every capability and this machine withholds
CAP_SYS_RESOURCE, so containers run with ``--userns``; builds with ``%post`` or ``%test`` fail
for the same reason.

The image is containers/pmpipe-cpu.def built by ``apptainer build --notest --sandbox`` from a
definition that keeps its ``%files``, ``%environment``, ``%labels``, ``%runscript``, ``%test``
and ``%help`` but starts from a local root (``Bootstrap: localimage``) instead of running
``%post``: that root is the definition's debootstrapped Debian with the venv that ``%post``
makes, into which the host's pip installs what ``%post`` would (requirements/run.txt with its
hashes, then pmpipe without dependencies). Both roots, and the image of the checkout
(:func:`cpu_image`), are kept in $PMPIPE_TEST_CACHE (default ~/.cache/pmpipe-tests), keyed by
what they are made from.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

from deffile import parse

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("PMPIPE_TEST_CACHE") or Path.home() / ".cache" / "pmpipe-tests")
DEFINITION = REPO / "containers" / "pmpipe-cpu.def"
MIRROR = "http://deb.debian.org/debian"
# What the image holds of the checkout: its %files and what pip installs from it
IMAGE_FILES = ("pmpipe", "pyproject.toml", "README.md", "requirements/run.txt")


class Unavailable(Exception):
    """What this machine lacks to run Apptainer."""


def _run(cmd, what: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode:
        raise Unavailable(
            f"{what} failed ({' '.join(map(str, cmd[:6]))} ...): "
            f"{(done.stderr or done.stdout)[-1500:]}"
        )
    return done


HOST_TOOLS = (("debootstrap", "debootstrap"), ("bubblewrap", "bwrap"))  # (Debian package, program)
APPTAINER_ROOT = CACHE / "apptainer-sid"


def missing_host_tools() -> list[str]:
    """The Debian packages of HOST_TOOLS whose program is not on PATH."""
    return [pkg for pkg, exe in HOST_TOOLS if shutil.which(exe) is None]


def provision_apptainer() -> None:
    """Debian sid's apptainer in a debootstrapped root (APPTAINER_ROOT), made once: what
    tests/provision.py does for the image tests. Raises Unavailable naming what is missing."""
    missing = missing_host_tools()
    if missing:
        raise Unavailable(f"{', '.join(missing)} missing (Debian packages)")
    _debootstrap(APPTAINER_ROOT, "sid", ["apptainer"])


def _debootstrap(dest: Path, suite: str, include: list[str], mirror: str = MIRROR) -> Path:
    """A minimal Debian root at ``dest`` (made beside it, then renamed: complete or absent)."""
    if dest.exists():
        return dest
    if os.geteuid() != 0:
        raise Unavailable("debootstrap needs root")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(include)}",
            suite,
            str(partial),
            mirror,
        ],
        f"debootstrap {suite}",
        timeout=1200,
    )
    partial.rename(dest)
    return dest


def apptainer_command(folder: Path) -> list[str]:
    """A command that runs apptainer (``[cmd, "exec", ...]`` etc.), written as a script in
    ``folder``, from the root tests/provision.py made. Raises Unavailable naming what is
    missing."""
    missing = missing_host_tools()
    if missing or not APPTAINER_ROOT.is_dir():
        raise Unavailable(
            f"Apptainer for the tests needs {' and '.join(missing + ['its Debian sid root'])} "
            f"({APPTAINER_ROOT}): run `python tests/provision.py` as root"
        )
    root = APPTAINER_ROOT
    if not (root / "etc" / "hosts").exists():  # apptainer binds it into every container
        shutil.copy("/etc/hosts", root / "etc" / "hosts")
    binds = []
    for path in sorted({Path("/tmp"), Path.home(), REPO, CACHE}):
        if not any(parent in binds for parent in path.parents):
            binds.append(path)
    script = folder / "apptainer"
    script.write_text(
        "#!/bin/sh\n# apptainer of a Debian sid root (tests/apptainer_image.py)\n"
        f"exec bwrap --bind {root} / "
        + " ".join(f"--bind {p} {p}" for p in binds)
        + ' --proc /proc --dev-bind /dev /dev --bind /sys /sys --chdir "$PWD" apptainer "$@"\n'
    )
    script.chmod(0o755)
    _run([str(script), "version"], "apptainer version")
    return [str(script)]


def _image_root() -> Path:
    """The definition's Debian with the venv of %post and requirements/run.txt installed into it
    by the host's pip (same Python minor version as the image's)."""
    definition = parse(DEFINITION)
    header = definition.header
    export = REPO / "requirements" / "run.txt"
    made_from = (
        repr(sorted(header.items())).encode() + export.read_bytes() + Path(__file__).read_bytes()
    )
    key = hashlib.sha256(made_from).hexdigest()[:12]
    dest = CACHE / f"pmpipe-cpu-root-{key}"
    if dest.exists():
        return dest
    for old in CACHE.glob("pmpipe-cpu-root-*"):
        shutil.rmtree(old, ignore_errors=True)
    debian = _debootstrap(
        CACHE / f"debian-{header['OSVersion']}-{key}",
        header["OSVersion"],
        header["Include"].split(),
        header.get("MirrorURL", MIRROR),
    )
    python = _run(
        ["chroot", str(debian), "python3", "-c", "import sys; print(*sys.version_info[:2])"],
        "python3 in the image",
    ).stdout.split()
    if tuple(map(int, python)) != sys.version_info[:2]:
        raise Unavailable(
            f"the image's Python {'.'.join(python)} differs from this one's "
            f"{sys.version_info.major}.{sys.version_info.minor}: the host's pip cannot "
            "install its wheels"
        )
    _run(["chroot", str(debian), "python3", "-m", "venv", "/opt/pmpipe/venv"], "python3 -m venv")
    _pip_target(debian, "--require-hashes", "-r", str(export))
    debian.rename(dest)
    return dest


def site_packages(root: Path) -> Path:
    (path,) = (root / "opt" / "pmpipe" / "venv" / "lib").glob("python3.*/site-packages")
    return path


def _pip_target(root: Path, *args: str) -> None:
    """pip install ARGS into the venv of ``root``, as the venv's pip would: packages into its
    site-packages, scripts (pip puts them in <target>/bin) into its bin/ run by its Python."""
    target = site_packages(root)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--upgrade",
            "--target",
            str(target),
            *args,
        ],
        f"pip install {' '.join(args)}",
        timeout=1800,
    )
    venv_bin = root / "opt" / "pmpipe" / "venv" / "bin"
    for script in sorted((target / "bin").glob("*")):
        lines = script.read_text().splitlines(keepends=True)
        if lines and lines[0].startswith("#!"):
            lines[0] = "#!/opt/pmpipe/venv/bin/python\n"
        (venv_bin / script.name).write_text("".join(lines))
        (venv_bin / script.name).chmod(0o755)
    shutil.rmtree(target / "bin", ignore_errors=True)


def localimage_definition(root: Path) -> str:
    """containers/pmpipe-cpu.def from ``root`` instead of its header and without %post; the
    version label that %post adds is a %labels line."""
    definition = parse(DEFINITION)
    version = importlib.metadata.version("pmpipe")
    text = f"Bootstrap: localimage\nFrom: {root}\n"
    for name, body in definition.sections.items():
        if name == "post":
            continue
        if name == "labels":
            body += f"\n    org.opencontainers.image.version {version}"
        text += f"\n%{name}\n{body}\n"
    return text


def cpu_image(apptainer: list[str], commit: str) -> Path:
    """The CPU image of this checkout labelled with ``commit``, built once into CACHE and kept
    there, keyed by everything it is built from (its root, the definition, the checkout's
    files that %files copies and pip installs), so that tests/provision.py builds it on an idle
    machine and the tests' workers, which may ask for it at once, find it (a lock makes one of
    them build it if it is missing). Only the two newest images are kept."""
    root = _image_root()
    made_from = localimage_definition(root).encode() + commit.encode()
    for name in IMAGE_FILES:
        for path in sorted((REPO / name).rglob("*")) if (REPO / name).is_dir() else [REPO / name]:
            if path.is_file() and "__pycache__" not in path.parts:
                made_from += str(path.relative_to(REPO)).encode() + path.read_bytes()
    dest = CACHE / f"image-pmpipe-cpu-{hashlib.sha256(made_from).hexdigest()[:12]}"
    with open(CACHE / "image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not dest.is_dir():
            partial = dest.with_name(dest.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            build_cpu_image(apptainer, partial, commit, root)
            partial.rename(dest)
            dest.touch()
        images = [p for p in CACHE.glob("image-pmpipe-cpu-*") if p.is_dir() and not p.suffix]
        images.sort(key=lambda p: p.stat().st_mtime)
        for old in images[:-2]:
            shutil.rmtree(old, ignore_errors=True)
    return dest


def build_cpu_image(apptainer: list[str], dest: Path, commit: str, root: Path) -> Path:
    """The CPU image from ``root`` as a sandbox directory ``dest``, with this checkout of
    pmpipe."""
    spec = dest.with_name(dest.name + ".def")
    spec.write_text(localimage_definition(root))
    _run(
        [
            *apptainer,
            "build",
            "--notest",
            "--build-arg",
            f"commit={commit}",
            "--sandbox",
            str(dest),
            str(spec),
        ],
        "apptainer build",
        cwd=REPO,
        timeout=900,
    )
    spec.unlink()
    _pip_target(dest, str(REPO))
    return dest


def find(folder: Path) -> tuple[list[str] | None, str | None]:
    """(apptainer command, None), or (None, what is missing)."""
    try:
        return apptainer_command(folder), None
    except Unavailable as missing:
        return None, str(missing)
