"""The package's structure: no import circle between its modules, its wings import only the
wings below them, stages are dispatched by an import, and the configuration side (reading,
validating and expanding campaigns) runs without JAX."""

import ast
import json
import re
import subprocess
import sys

from conftest import REPO

PACKAGE = REPO / "pmpipe"


def _module_names() -> dict[str, object]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """pmpipe module -> the pmpipe modules it imports, at its top or inside its functions."""
    modules = _module_names()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in modules:
                        graph[name].add(full)
                    elif base in modules:
                        graph[name].add(base)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (or a module importing itself)."""
    index, low, stack, found = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1 or v in graph[v]:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_the_package_imports_itself_through_others():
    graph = import_graph()
    assert len(graph) > 40 and "pmpipe.run.config" in graph["pmpipe.campaigns.campaign"]
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    graph = import_graph()
    graph["pmpipe.run.config"] = graph["pmpipe.run.config"] | {"pmpipe.campaigns.campaign"}
    assert any({"pmpipe.run.config", "pmpipe.campaigns.campaign"} <= set(c) for c in circles(graph))


# The wings of the package, top to bottom (docs/architecture.md): a module imports only from
# its own wing and the wings below it; ``pmpipe`` itself, the Python API (pmpipe.open_campaign),
# is above them all: no module imports it. The physics wing is itself stacked in sub-wings.
WINGS = (
    "cli",
    "diagnostics",
    "bench",
    "cluster",
    "job",
    "results",
    "campaigns",
    "stages",
    "storage",
    "run",
    "physics",
    "runtime",
)
PHYSICS = ("statistics", "lensing", "evolution", "theory", "mesh")
MAX_MODULES_PER_FOLDER = 16


def wing(module: str) -> str:
    """'physics.evolution' for pmpipe.physics.evolution.particle_mesh, 'stages' for
    pmpipe.stages.nbody, 'pmpipe' for the package itself."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "physics":
        return f"physics.{parts[2]}"
    return parts[1] if len(parts) > 1 else "pmpipe"


def rank(name: str) -> tuple[int, int]:
    """(wing, sub-wing) position of a wing's name, top first; the package itself above all."""
    if name == "pmpipe":
        return (-1, 0)
    top, _, sub = name.partition(".")
    return (WINGS.index(top), PHYSICS.index(sub) if sub else 0)


def upward_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a module imports from a wing above its own."""
    return sorted(
        (module, target)
        for module, imported in graph.items()
        for target in imported
        if rank(wing(target)) < rank(wing(module))
    )


def test_every_module_lives_in_a_wing_and_imports_only_its_own_and_those_below():
    graph = import_graph()
    wings = {wing(m) for m in graph}
    assert wings == set(WINGS) - {"physics"} | {f"physics.{s}" for s in PHYSICS} | {
        "physics",
        "pmpipe",
    }, sorted(wings)
    assert upward_arrows(graph) == []


def test_no_folder_holds_too_many_modules_and_no_two_modules_share_a_name():
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    crowded = {
        str(f.relative_to(REPO)): n
        for f in folders
        if (n := len(list(f.glob("*.py")))) > MAX_MODULES_PER_FOLDER
    }
    assert crowded == {}, crowded
    names: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.stem, []).append(str(path.relative_to(REPO)))
    assert {n: p for n, p in names.items() if len(p) > 1} == {}


def test_the_wing_check_finds_an_upward_arrow():
    graph = import_graph()
    mesh, cosmology = "pmpipe.physics.mesh.painting", "pmpipe.physics.theory.cosmology"
    graph[mesh] = graph[mesh] | {"pmpipe.run.config", cosmology}
    assert upward_arrows(graph) == [(mesh, cosmology), (mesh, "pmpipe.run.config")]


def test_stage_dispatch_is_an_import_the_graph_shows():
    """The registry imports every stage module; nothing loads a pmpipe module by name."""
    from pmpipe import stages

    graph = import_graph()
    assert {f"pmpipe.stages.{s}" for s in stages.STAGES} <= graph["pmpipe.stages.registry"]
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
                assert path.name == "doctor.py", f"{path} loads a module by name"


# The configuration side: models, reading and errors, host checks, campaigns and their
# expansion, seeds, site settings, and what the workflow's Snakefile imports to plan a campaign.
CONFIGURATION = [
    "pmpipe.run.config",
    "pmpipe.run.validation",
    "pmpipe.campaigns.campaign",
    "pmpipe.campaigns.seeds",
    "pmpipe.cluster.site",
    "pmpipe.cluster.workflow",
    "pmpipe.runtime.compilation_cache",
]

LOAD_EVERY_CAMPAIGN = """
import json, sys
from pathlib import Path
from pmpipe.campaigns import campaign
from pmpipe.cluster import workflow
loaded = {str(p): len(campaign.load(p).runs) for p in sorted(Path("config").rglob("*.yaml"))}
expansions, expand = [], campaign.expand
campaign.expand = lambda *args, **kwargs: expansions.append(1) or expand(*args, **kwargs)
plan = workflow.prepare({}, results=Path(sys.argv[1]))
print(json.dumps({"loaded": loaded, "runs": len(plan.run_ids), "expansions": len(expansions),
                  "written": sorted(str(p) for p in Path(sys.argv[1]).rglob("*")),
                  "jax": sorted(m for m in sys.modules if m == "jax" or m.startswith("jax."))}))
"""


def test_configuration_modules_and_campaign_planning_import_no_jax_and_expand_once(tmp_path):
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                f"import sys; import {', '.join(CONFIGURATION)}; "
                "print(sorted(m for m in sys.modules if m.split('.')[0] == 'jax'))"
            ),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=True,
    )
    assert imported.stdout.strip() == "[]", imported.stdout
    planned = subprocess.run(
        [sys.executable, "-c", LOAD_EVERY_CAMPAIGN, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert planned.returncode == 0, planned.stderr[-3000:]
    out = json.loads(planned.stdout)
    assert len(out["loaded"]) >= 5 and all(n >= 1 for n in out["loaded"].values()), out
    assert out["runs"] == 6 and out["expansions"] == 1 and out["jax"] == [], out
    assert out["written"] == [], out  # planning writes nothing


# Sizes a reader can hold (docs/architecture.md): a function with more parameters says why in a
# comment on its signature, "# parameters: <why>".
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 500, 80, 7


def oversized(path) -> list[str]:
    """What in the module at path is over the limits: the module's lines, a function's lines,
    a function's parameters (self and cls not counted) without a '# parameters:' comment."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    if len(lines) > MAX_MODULE_LINES:
        found.append(f"{path.name}: {len(lines)} lines")
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        where = f"{path.name}:{node.lineno} {node.name}"
        length = node.end_lineno - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
            found.append(f"{where}: {length} lines")
        args = node.args
        names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
        count = len([n for n in names if n not in ("self", "cls")])
        signature = lines[node.lineno - 1 : node.body[0].lineno - 1]
        if count > MAX_PARAMETERS and not any("# parameters:" in line for line in signature):
            found.append(f"{where}: {count} parameters")
    return found


MAX_WIDE_FUNCTIONS = 3  # functions of more than MAX_PARAMETERS, each saying why


def wide_functions() -> list[str]:
    """'module:line name' of every function of the package with more than MAX_PARAMETERS."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
                if len([n for n in names if n not in ("self", "cls")]) > MAX_PARAMETERS:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    return found


def test_no_module_function_or_signature_is_too_large():
    found = [problem for path in sorted(PACKAGE.rglob("*.py")) for problem in oversized(path)]
    assert found == [], "\n".join(found)
    wide = wide_functions()
    assert 0 < len(wide) <= MAX_WIDE_FUNCTIONS, wide  # the compiled programs' own arguments


def test_the_size_check_finds_what_is_too_large(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    source = tmp_path / "big.py"
    source.write_text(
        f"def long():\n{body}\n\n\ndef wide(a, b, c, d, e, f, g, h):\n    pass\n\n\n"
        "def explained(a, b, c, d, e, f, g, h):  # parameters: a test says why\n    pass\n"
        + "\n"
        * MAX_MODULE_LINES
    )
    assert oversized(source) == [
        f"big.py: {MAX_MODULE_LINES + MAX_FUNCTION_LINES + 9} lines",
        f"big.py:1 long: {MAX_FUNCTION_LINES + 1} lines",
        "big.py:84 wide: 8 parameters",
    ]


def test_the_architecture_page_names_every_wing_and_only_what_exists():
    text = (REPO / "docs/architecture.md").read_text()
    named = set(re.findall(r"pmpipe/[\w/]+(?:\.py)?", text))
    assert {f"pmpipe/{w}" for w in WINGS} <= named, sorted(named)
    missing = sorted(n for n in named if not (REPO / n).exists())
    assert missing == [], f"docs/architecture.md names what the tree lacks: {missing}"
    packages = {p.parent.relative_to(REPO).as_posix() for p in PACKAGE.glob("**/__init__.py")}
    wings = {f"pmpipe/{w}" for w in WINGS} | {f"pmpipe/physics/{s}" for s in PHYSICS}
    assert packages - {"pmpipe"} - wings <= {"pmpipe/bench/peers", "pmpipe/bench/validation"}
    assert wings <= packages and wings <= named, sorted(packages)
