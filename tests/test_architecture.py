"""The package's structure: no import circle between its modules, its rooms import only the
rooms below them, and the configuration side (reading, validating and expanding campaigns)
runs without JAX."""

import ast
import json
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
    assert len(graph) > 40 and "pmpipe.config" in graph["pmpipe.orchestration.campaign"]
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    graph = import_graph()
    graph["pmpipe.config"] = graph["pmpipe.config"] | {"pmpipe.orchestration.campaign"}
    assert any({"pmpipe.config", "pmpipe.orchestration.campaign"} <= set(c) for c in circles(graph))


def room(module: str) -> str:
    """'physics' for pmpipe.physics.nbody, the module itself for a top-level one."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or module in ROOMS else module


ROOMS = {
    "pmpipe.physics": "physics",
    "pmpipe.storage": "storage",
    "pmpipe.orchestration": "orchestration",
    "pmpipe.stages": "stages",
}
# What a room may import from the package besides itself (docs/design.md)
BELOW = {
    "pmpipe.config": set(),
    "physics": {"pmpipe.config", "pmpipe.parallel"},
    "storage": {"physics", "pmpipe.config", "pmpipe.parallel", "pmpipe.image", "pmpipe.log"},
}


def test_each_room_imports_only_the_rooms_below_it():
    graph = import_graph()
    for module, imported in graph.items():
        if room(module) in BELOW:
            outside = {room(m) for m in imported} - {room(module)} - BELOW[room(module)]
            assert not outside, f"{module} imports {sorted(outside)}"
    assert room("pmpipe.physics.nbody") == "physics" and room("pmpipe.config") == "pmpipe.config"


# The configuration side: models, reading and errors, host checks, campaigns and their
# expansion, seeds, site settings, and what the workflow's Snakefile imports to plan a campaign.
CONFIGURATION = [
    "pmpipe.config",
    "pmpipe.validation",
    "pmpipe.orchestration.campaign",
    "pmpipe.orchestration.seeds",
    "pmpipe.orchestration.site",
    "pmpipe.orchestration.workflow",
    "pmpipe.compilation_cache",
]

LOAD_EVERY_CAMPAIGN = """
import json, sys
from pathlib import Path
from pmpipe.orchestration import campaign, workflow
loaded = {str(p): len(campaign.load(p).runs) for p in sorted(Path("config").rglob("*.yaml"))}
expansions, expand = [], campaign.expand
campaign.expand = lambda *args, **kwargs: expansions.append(1) or expand(*args, **kwargs)
plan = workflow.prepare({}, prune=False, results=Path(sys.argv[1]))
print(json.dumps({"loaded": loaded, "runs": len(plan.run_ids), "expansions": len(expansions),
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
