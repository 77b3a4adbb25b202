"""Reading configuration files: the strict model every section derives from, YAML and JSON
with size limits, and the errors that name the file and the field. Imports no JAX."""

from __future__ import annotations

import difflib
import json
import os
import stat
import types
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

Section = TypeVar("Section")


def section(value: Section | None, name: str) -> Section:
    """An optional section of a run (``run.lightcone``, say) that the caller needs; ValueError
    naming it when the run has none."""
    if value is None:
        raise ValueError(f"the run has no {name} section")
    return value


class StrictModel(BaseModel):
    """A configuration section: unknown keys, infinities and NaNs rejected; frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ConfigError(ValueError):
    """A configuration file that does not validate; the message names file and fields."""


def invalid(source: str, field: str, message: str) -> ConfigError:
    """A ConfigError of one problem, laid out as :func:`format_errors` lays out its lines
    (``field`` empty: a problem of the whole file, whose message names its fields)."""
    return ConfigError(
        f"{source}: invalid configuration\n  {field + ': ' if field else ''}{message}"
    )


def _models(annotation) -> list[type[BaseModel]]:
    """The configuration models a field's annotation holds (through Optional, unions, lists,
    mappings and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


def _tagged(models: list[type[BaseModel]], tag: object) -> list[type[BaseModel]]:
    """The models of a tagged union whose ``kind`` is ``tag`` (none: not a tag)."""
    return [
        m
        for m in models
        if "kind" in m.model_fields and tag in typing.get_args(m.model_fields["kind"].annotation)
    ]


def allowed_keys(model: type[BaseModel], loc: Collection[object]) -> list[str]:
    """The keys the section at ``loc`` (a path of field names, list indices, mapping keys or
    union tags below ``model``) allows: the fields of every model it can be."""
    candidates = [model]
    for part in loc:
        inner = [
            m
            for candidate in candidates
            if isinstance(part, str) and part in candidate.model_fields
            for m in _models(candidate.model_fields[part].annotation)
        ]
        candidates = inner or _tagged(candidates, part) or candidates  # an index or a key
    return sorted({name for m in candidates for name in m.model_fields})


def _suggestion(model: type[BaseModel] | None, loc: tuple) -> str:
    """'; did you mean ...?' for an unknown key at ``loc`` close to an allowed one, else ''."""
    if model is None or not loc:
        return ""
    allowed = [key for key in allowed_keys(model, loc[:-1]) if key != loc[-1]]
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def format_errors(
    source: str,
    err: ValidationError,
    unions: Mapping[str, Collection[str]] = {},
    model: type[BaseModel] | None = None,
) -> str:
    """One line per problem: file, dotted field path, message and the value given. ``unions``
    maps a top-level field holding a tagged union to its tags, which are left out of the path
    (design.grid.parameters reads design.parameters). With the ``model`` validated, an
    unknown key close to an allowed one gets a suggestion; a problem of the whole file has no
    path."""
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        parts = [str(x) for x in e["loc"]]
        if len(parts) > 1 and parts[1] in unions.get(parts[0], ()):
            del parts[1]
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _suggestion(model, e["loc"])
        shown = (
            e["type"] != "missing"
            and not isinstance(e["input"], dict)
            and len(repr(e["input"])) <= 80
        )
        given = f" (got {e['input']!r})" if shown else ""  # no dumps of whole sections
        lines.append(f"  {'.'.join(parts) + ': ' if parts else ''}{msg}{given}")
    return "\n".join(lines)


MAX_FILE_BYTES = 2**20  # a configuration file is at most this large
MAX_VALUES = 100_000  # values in a configuration once its YAML aliases are expanded
MAX_DEPTH = 32  # nesting of mappings and lists


MAX_TABLE_BYTES = 8 * 2**20  # a table of numbers (a P(k) as CAMB or CLASS write it: ~0.1 MB)


def read_text(path: str | Path, max_bytes: int, what: str) -> str:
    """The UTF-8 text of the regular file at path, reading at most ``max_bytes`` + 1 bytes;
    ConfigError naming the file and ``what`` it should be when it is something else (a
    device, a FIFO, a folder), larger, unreadable or not text."""
    path = Path(path)
    try:  # non-blocking: opening a FIFO must not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{path}: not a regular file; a {what} is a text file")
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(max_bytes + 1)
        except OSError as err:
            raise ConfigError(f"{path}: cannot be read ({err.strerror})") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{path}: larger than {max_bytes} bytes; a {what} is at most that")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_columns(path: str | Path, what: str, max_bytes: int = MAX_TABLE_BYTES) -> np.ndarray:
    """A text table of numbers as float64 (rows, columns): whitespace-separated numbers, lines
    or line ends after '#' are comments. ConfigError (:func:`read_text`) for a file that is not
    such a table, naming the line but echoing none of its content."""
    rows = []
    for number, line in enumerate(read_text(path, max_bytes, what).splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            rows.append([float(word) for word in words])
        except ValueError:
            raise ConfigError(
                f"{path}: line {number} is not numbers; a {what} holds whitespace-separated "
                "numbers and '#' comments"
            ) from None
        if len(rows[-1]) != len(rows[0]):
            raise ConfigError(
                f"{path}: line {number} has {len(rows[-1])} columns, the first row "
                f"{len(rows[0])}; a {what} has the same number on every line"
            )
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(rows[0]) if rows else 0)


def read_healpix_map(path: str | Path, nside: int) -> np.ndarray:
    """The HEALPix map (RING, float64) of a .npy or FITS file; ConfigError naming the file
    when it is unreadable, not one map, or of another nside."""
    import healpy

    try:
        values = np.load(path) if str(path).endswith(".npy") else healpy.read_map(path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a readable .npy or FITS HEALPix map ({err})") from None
    values = np.asarray(values, np.float64)
    if values.ndim != 1 or not healpy.isnpixok(values.size):
        raise ConfigError(f"{path}: values of shape {values.shape} are not one HEALPix map")
    if healpy.npix2nside(values.size) != nside:
        raise ConfigError(f"{path} has nside {healpy.npix2nside(values.size)}, not {nside}")
    return values


def read_flat_map(path: str | Path, pixels: int) -> np.ndarray:
    """The square image (pixels, pixels; float64, first axis θx) of a .npy file; ConfigError
    naming the file when it is unreadable or of another shape."""
    try:
        values = np.asarray(np.load(path), np.float64)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a readable .npy image ({err})") from None
    if values.shape != (pixels, pixels):
        raise ConfigError(
            f"{path} holds an image of shape {values.shape}, not ({pixels}, {pixels})"
        )
    return values


def read_mapping(path: str | Path) -> dict:
    """The top-level mapping of a JSON or YAML (.yaml / .yml) file; ConfigError names the file.
    YAML is read with the safe loader (no Python tags); a file over MAX_FILE_BYTES (or not a
    regular file), or whose values (aliases expanded) exceed MAX_VALUES or nest deeper than
    MAX_DEPTH, is refused."""
    path = Path(path)
    text = read_text(path, MAX_FILE_BYTES, "configuration file")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML ({err})") from None
    else:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections, got {type(data).__name__}"
        )
    _check_size(data, path)
    return data


def _check_size(data, path: Path) -> None:
    """ConfigError when data holds more than MAX_VALUES values (shared YAML aliases counted at
    every use) or nests deeper than MAX_DEPTH."""
    count, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(
                f"{path}: more than {MAX_VALUES} values once its aliases are "
                "expanded; a configuration is far smaller"
            )
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ConfigError(f"{path}: nested deeper than {MAX_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, (dict, list, tuple)):
                    raise ConfigError(f"{path}: a key that is a mapping or a list")
                stack.append((item, depth + 1))


def validate(
    model: type[BaseModel],
    data: dict,
    source: str | Path,
    unions: Mapping[str, Collection[str]] = {},
):
    """model.model_validate(data), with errors turned into a ConfigError naming source and
    fields (:func:`format_errors`). Validators read the source from the context's
    ``source``; a ConfigError they raise, which names its file and fields already, is raised
    as it is."""
    try:
        return model.model_validate(data, context={"source": str(source)})
    except ValidationError as err:
        for e in err.errors():
            if isinstance(e.get("ctx", {}).get("error"), ConfigError):
                raise e["ctx"]["error"] from None
        raise ConfigError(format_errors(str(source), err, unions, model)) from None
