"""The package as a whole: ruff finds nothing with the rules of pyproject.toml ([tool.ruff]),
its formatter would change nothing, mypy with pydantic's plugin finds nothing ([tool.mypy]),
and it reports its version; the README's API snippet imports it from anywhere."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO

# mypy's incremental cache outlives the session, as the compiled programs do (conftest.PROGRAMS):
# mypy checks again every module whose source, or whose dependencies' interface, changed
MYPY_CACHE = Path(tempfile.gettempdir()) / f"pmpipe-test-mypy-{os.getuid()}"


def test_ruff_finds_nothing_in_the_package_and_the_tests():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--output-format",
            "concise",
            "pmpipe",
            "tests",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_formatter_would_change_nothing():
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "pmpipe", "tests"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


@pytest.mark.slow
def test_mypy_finds_nothing_in_the_package():
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(MYPY_CACHE)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "Success: no issues found" in out.stdout


def test_the_package_reports_the_version_of_its_project():
    import tomllib

    import pmpipe

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert pmpipe.__version__ == project["version"]


def test_the_readme_api_snippet_runs_from_the_folder_above_a_clone_named_pmpipe(tmp_path):
    """A folder named pmpipe in the current directory (a clone's own, with its config/ folder)
    does not shadow the installed package as a namespace package: the README's API snippet runs
    there and imports this pmpipe."""
    import re
    from pathlib import Path

    import pmpipe

    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    snippet = next(block for block in blocks if "simulation.simulate" in block)
    (tmp_path / "pmpipe" / "config").mkdir(parents=True)
    out = subprocess.run(
        [sys.executable, "-c", snippet + "\nimport pmpipe\nprint(pmpipe.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert Path(out.stdout.split()[-1]) == Path(pmpipe.__file__)


def test_the_readme_lists_every_page_of_the_docs():
    readme = (REPO / "README.md").read_text()
    listed = readme.split("## Documentation", 1)[1]
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert [p for p in pages if f"- docs/{p}:" not in listed] == []


def _commit_seen_from(clone) -> list[str]:
    """[the provenance module's file, git_commit()] as a Python started in ``clone`` sees
    them, with the clone first on its path."""
    import os

    code = (
        "from pmpipe.storage import provenance; "
        "print(provenance.__file__); print(provenance.git_commit())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=clone,
        env={**os.environ, "PYTHONPATH": str(clone)},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()[-2:]


def _clone(tmp_path):
    clone = tmp_path / "pmpipe"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    head = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return clone, head


def test_provenance_records_the_commit_of_a_clone(tmp_path):
    from pathlib import Path

    clone, head = _clone(tmp_path)
    module, commit = _commit_seen_from(clone)
    assert Path(module).is_relative_to(clone) and commit == head


def test_provenance_records_the_commit_of_a_clone_owned_by_another_user(tmp_path):
    """git refuses a repository owned by another user ('dubious ownership'): the commit of a
    shared clone, or of one bind-mounted into a container, is recorded all the same."""
    import os

    if os.geteuid() != 0:
        pytest.skip("giving the clone to another user needs root")
    clone, head = _clone(tmp_path)
    subprocess.run(["chown", "-R", "nobody", str(clone)], check=True)
    assert _commit_seen_from(clone)[1] == head


def test_the_commit_is_read_from_git_s_files_where_git_cannot_be_asked(tmp_path):
    from pmpipe.storage import provenance

    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text("# pack-refs\n" + "a" * 40 + " refs/heads/main\n")
    assert provenance.head_commit(git) == "a" * 40
    (git / "refs" / "heads" / "main").write_text("b" * 40 + "\n")
    assert provenance.head_commit(git) == "b" * 40
    (git / "HEAD").write_text("c" * 40 + "\n")  # detached
    assert provenance.head_commit(git) == "c" * 40
    assert provenance.head_commit(tmp_path / "none") is None
