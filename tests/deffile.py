"""A reader of Apptainer definition files: the header (``Key: value`` lines before the first
section) and the sections (``%name`` lines, each with the text up to the next one), as
Apptainer's own parser splits them."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

SECTIONS = (
    "setup",
    "files",
    "post",
    "environment",
    "labels",
    "runscript",
    "startscript",
    "test",
    "help",
    "arguments",
    "pre",
)
_SECTION = re.compile(r"^%(\w+)\s*(.*)$")


@dataclasses.dataclass(frozen=True)
class Definition:
    header: dict[str, str]
    sections: dict[str, str]

    def files(self) -> list[tuple[str, str]]:
        """%files as (source relative to the build directory, destination in the image)."""
        return [tuple(shlex.split(line)) for line in _lines(self.sections.get("files", ""))]

    def labels(self) -> dict[str, str]:
        """%labels as {name: value}."""
        return dict(line.split(None, 1) for line in _lines(self.sections.get("labels", "")))

    def commands(self, section: str) -> list[list[str]]:
        """The simple commands of a shell section, each as its words (no comments)."""
        return [
            shlex.split(line, comments=True)
            for line in _lines(self.sections.get(section, ""))
            if shlex.split(line, comments=True)
        ]


def _lines(text: str) -> list[str]:
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def parse(path: str | Path) -> Definition:
    """Header and sections of a definition file; raises ValueError naming the file and line of
    an unknown section, a malformed header line or a section given twice."""
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current = None
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        match = _SECTION.match(line)
        if match:
            current = match[1]
            if current not in SECTIONS:
                raise ValueError(f"{path}:{number}: unknown section %{current}")
            if current in sections:
                raise ValueError(f"{path}:{number}: section %{current} given twice")
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
        elif line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition(":")
            if not sep or not key.strip() or " " in key.strip():
                raise ValueError(f"{path}:{number}: header lines are 'Key: value' (got {line!r})")
            header[key.strip()] = value.strip()
    return Definition(header, {name: "\n".join(body) for name, body in sections.items()})
