"""Samples of command output in the docs are what the commands print now: every indented
`$ pmpipe plan <file>` block of README.md and docs/*.md is run, and each of its lines but
'...' must be a line of the output."""

import re

import pytest
from conftest import REPO

from pmpipe import cli

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def plan_samples():
    """(page, campaign file, sample lines) of every plan sample."""
    found = []
    for page in PAGES:
        for block in re.findall(r"\n    \$ pmpipe plan (\S+)\n((?:    .*\n)+)", page.read_text()):
            lines = [line[4:] for line in block[1].splitlines()]
            found.append(pytest.param(block[0], lines, id=f"{page.name}:{block[0]}"))
    return found


def test_the_docs_have_plan_samples():
    assert plan_samples()


@pytest.mark.parametrize(("campaign", "sample"), plan_samples())
def test_a_plan_sample_is_what_plan_prints(campaign, sample, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert cli.main(["plan", campaign, "--results", str(tmp_path)]) == 0
    out = capsys.readouterr()
    printed = (out.out + out.err).splitlines()
    for line in sample:
        if line != "...":
            assert line in printed, (line, printed)
