"""The shape of the code, checked: the rules docs/ARCHITECTURE.md states hold.

- no import cycle between the modules of agenttest_worker and agenttest_submit, nor
  between agenttest_worker's packages, counting imports inside functions;
- the engine imports neither Celery, kombu, redis nor SQLAlchemy;
- no module over 500 lines, and at most 8 modules at agenttest_worker's top level;
- every package says what it is for, and declares what it exports;
- every package and module docs/ARCHITECTURE.md names exists.

They read the source with `ast`, but for two: the engine is imported in a fresh
interpreter, where what this test process has already imported cannot hide what it
pulls in, and each package's exports are looked up on the imported package.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agenttest_worker", "agenttest_submit")
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"

MAX_LINES = 500
MAX_TOP_LEVEL_MODULES = 8
# What the engine must not import, directly or through anything it imports.
NOT_IN_THE_ENGINE = ("celery", "kombu", "redis", "sqlalchemy")


# -- the modules and their imports --------------------------------------------------------


@dataclass(frozen=True)
class Module:
    name: str  # dotted: agenttest_worker.store.sql.turns
    path: Path
    is_package: bool  # an __init__.py: the module of its directory

    @property
    def where(self) -> str:
        return self.path.relative_to(ROOT).as_posix()


@dataclass(frozen=True)
class Import:
    """One import statement's edge: `source` imports `target`, at `line` of its file."""

    source: str
    target: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{MODULES[self.source].where}:{self.line}: {self.text}"


def _modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = Module(".".join(parts), path, is_package)
    return found


MODULES = _modules()


@cache
def _tree(module: Module) -> ast.Module:
    return ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))


def _is_type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run: the whole tree, function bodies included, except the
    body of `if TYPE_CHECKING:` blocks (their `else:` runs, so it counts)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _project_module(name: str, modules: dict[str, Module]) -> str | None:
    """The project module that importing `name` runs last: `name` itself or, for an
    attribute path like agenttest_worker.engine.RunOptions, its longest module prefix;
    None for anything outside the two packages."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _from_base(module: Module, node: ast.ImportFrom) -> str:
    """The absolute package or module a `from X import ...` reads from."""
    if not node.level:
        return node.module or ""
    # `.` is the package the module is in (for an __init__.py, that package itself);
    # each further dot goes one package up.
    package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def _calls_import_module(tree: ast.AST) -> bool:
    return any(
        (isinstance(node, ast.Name) and node.id == "import_module")
        or (isinstance(node, ast.Attribute) and node.attr == "import_module")
        for node in _runtime_nodes(tree)
    )


def _targets(module: Module, node: ast.AST, modules: dict[str, Module] = MODULES) -> list[str]:
    """The project modules (of `modules`) one node imports.

    Importing a.b.c also runs a/__init__.py and a/b/__init__.py first; those parents are
    not counted, as import tools do not count them: a package's __init__ that exports
    names of its own modules would otherwise form a cycle with each of them."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = _from_base(module, node)
        # `from pkg import name` imports the submodule pkg.name when there is one (that is
        # what runs), else it reads an attribute of pkg.
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
        # Lazy exports (`importlib.import_module("agenttest_worker.driver.step")` from a
        # table of names): a string naming a project module in a module that calls
        # import_module is an import inside a function like any other.
        names = [node.value]
    else:
        return []
    found = (_project_module(name, modules) for name in names)
    return [target for target in found if target is not None and target != module.name]


@cache
def _lines(module: Module) -> list[str]:
    return module.path.read_text(encoding="utf-8").splitlines()


def _text(module: Module, line: int) -> str:
    """The line of the source, as the failure messages quote it."""
    text = _lines(module)[line - 1].strip()
    return text if len(text) <= 100 else text[:97] + "..."


@cache
def imports() -> tuple[Import, ...]:
    """Every import between project modules, with where it is written."""
    found: list[Import] = []
    for module in MODULES.values():
        tree = _tree(module)
        strings_import = _calls_import_module(tree)
        for node in _runtime_nodes(tree):
            if isinstance(node, ast.Constant) and not strings_import:
                continue
            line: int = getattr(node, "lineno", 0)
            for target in dict.fromkeys(_targets(module, node)):
                found.append(Import(module.name, target, line, _text(module, line)))
    return tuple(found)


# -- cycles ---------------------------------------------------------------------------------


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """The graph's cycles: each set of two or more nodes that all reach each other
    (strongly connected components), sorted. The graphs here have under two hundred
    nodes, so reachability from every node is cheap and easier to read than Tarjan's."""
    nodes = set(edges) | {b for targets in edges.values() for b in targets}

    def reachable(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for target in edges.get(todo.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    reach = {node: reachable(node) for node in nodes}
    components: list[list[str]] = []
    done: set[str] = set()
    for node in sorted(nodes):
        if node in done or node not in reach[node]:
            continue  # not on any cycle
        component = sorted(other for other in reach[node] if node in reach[other])
        done.update(component)
        components.append(component)
    return components


def describe_cycles(components: list[list[str]], group: dict[str, str], what: str) -> str:
    """The failure message: each cycle's members and the import lines that close it."""
    lines = [f"{len(components)} import cycle(s) between {what}:"]
    for component in components:
        members = set(component)
        lines.append(f"- {', '.join(component)}")
        for edge in imports():
            source, target = group[edge.source], group[edge.target]
            if source != target and source in members and target in members:
                lines.append(f"    {source} -> {target}: {edge}")
    return "\n".join(lines)


def test_no_import_cycle_between_modules() -> None:
    """Counting imports inside functions and lazy exports; not `if TYPE_CHECKING:`
    imports, which never run."""
    edges: dict[str, set[str]] = defaultdict(set)
    for edge in imports():
        edges[edge.source].add(edge.target)
    cycles = strongly_connected(edges)
    assert not cycles, describe_cycles(cycles, {m: m for m in MODULES}, "modules")


def package_of(module: str) -> str:
    """agenttest_worker.<package> for a module inside one of its packages (however deep);
    a top-level module of agenttest_worker stands for itself; agenttest_submit is one."""
    parts = module.split(".")
    if parts[0] != "agenttest_worker":
        return parts[0]
    if len(parts) > 1 and MODULES.get(".".join(parts[:2]), MODULES[module]).is_package:
        return ".".join(parts[:2])
    return module


def test_no_import_cycle_between_packages() -> None:
    """Modules grouped by agenttest_worker's packages: a package may use another only if
    that one uses nothing of it, or the data flow's direction is lost."""
    group = {m: package_of(m) for m in MODULES}
    edges: dict[str, set[str]] = defaultdict(set)
    for edge in imports():
        if group[edge.source] != group[edge.target]:
            edges[group[edge.source]].add(group[edge.target])
    cycles = strongly_connected(edges)
    assert not cycles, describe_cycles(cycles, group, "packages")


def test_the_cycle_finder_sees_cycles() -> None:
    """The finder itself, on a graph with two cycles and a tail."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"], ["d", "e"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_imports_resolve_to_the_submodule_they_run() -> None:
    """Relative imports and `from package import submodule` count as imports of the
    submodule, not of the package: the finder sees what actually runs."""
    table = {
        name: Module(name, ROOT / "nowhere.py", is_package)
        for name, is_package in [
            ("p", True),
            ("p.settings", False),
            ("p.engine", True),
            ("p.engine.state", False),
            ("p.driver", True),
            ("p.driver.budget", False),
            ("p.driver.step", False),
        ]
    }
    package, module = table["p.driver"], table["p.driver.step"]
    for source, statement, expected in [
        (module, "from . import budget", ["p.driver.budget"]),
        (module, "from .budget import budget_spent", ["p.driver.budget"]),
        (module, "from ..engine import state, RunOptions", ["p.engine.state", "p.engine"]),
        (package, "from .step import run_step", ["p.driver.step"]),
        (package, "from . import step", ["p.driver.step"]),
        (module, "from p.engine import RunOptions", ["p.engine"]),
        (module, "import p.engine.state", ["p.engine.state"]),
        (module, "from p import settings", ["p.settings"]),
        (module, "from p.driver.step import Advance", []),  # itself
        (module, "import sqlalchemy", []),
        (package, "import_module('p.driver.step')", ["p.driver.step"]),
    ]:
        node = ast.parse(statement).body[0]
        if isinstance(node, ast.Expr):  # the string a lazy export imports
            node = node.value.args[0]  # type: ignore[attr-defined]
        assert _targets(source, node, table) == expected, statement
    checked = "if TYPE_CHECKING:\n    import a\nelse:\n    import b\ndef f():\n    import c\n"
    imported = [
        n.names[0].name for n in _runtime_nodes(ast.parse(checked)) if isinstance(n, ast.Import)
    ]
    assert sorted(imported) == ["b", "c"]


# -- the engine stays pure --------------------------------------------------------------------

_IMPORT_THE_ENGINE = """
import importlib, json, pkgutil, sys
import agenttest_worker.engine as engine
for info in pkgutil.walk_packages(engine.__path__, "agenttest_worker.engine."):
    importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def _import_chains(importtime: str, wanted: tuple[str, ...]) -> list[str]:
    """From `python -X importtime` output, how each wanted module was reached:
    "agenttest_worker.engine > agenttest_worker.agents.pool > aiohttp > ...". The output
    lists a module after everything it imported, one indent deeper than its importer."""
    rows: list[tuple[int, str]] = []
    for line in importtime.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1]
            rows.append((len(name) - len(name.lstrip()), name.strip()))
    chains = []
    for i, (depth, name) in enumerate(rows):
        if name.split(".")[0] not in wanted or "." in name:
            continue
        chain = [name]
        for later_depth, importer in rows[i + 1 :]:
            if later_depth < depth:
                chain.append(importer)
                depth = later_depth
        chains.append(" > ".join(reversed(chain)))
    return chains


def test_the_engine_imports_neither_celery_kombu_redis_nor_sqlalchemy() -> None:
    """In a fresh interpreter, the engine package and every module in it."""
    command = [sys.executable, "-c", _IMPORT_THE_ENGINE]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    found = sorted({m.split(".")[0] for m in loaded} & set(NOT_IN_THE_ENGINE))
    if found:
        traced = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", _IMPORT_THE_ENGINE],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        chains = "\n".join(_import_chains(traced.stderr, tuple(found)))
        pytest.fail(f"importing the engine imports {', '.join(found)}:\n{chains}")


def test_no_engine_module_imports_them_even_inside_a_function() -> None:
    """What the fresh interpreter cannot see: an import that waits in a function."""
    found = []
    for module in MODULES.values():
        if not module.name.startswith("agenttest_worker.engine"):
            continue
        for node in _runtime_nodes(_tree(module)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            if any(name.split(".")[0] in NOT_IN_THE_ENGINE for name in names):
                found.append(f"{module.where}:{node.lineno}: {_text(module, node.lineno)}")
    assert not found, "the engine imports what it must not:\n" + "\n".join(found)


# -- sizes ------------------------------------------------------------------------------------


def _is_face(name: str) -> bool:
    """A face of agenttest_worker: one of its packages (its __init__.py) or one of its
    top-level modules; anything deeper is the package's own business."""
    parts = name.split(".")
    return parts[0] == "agenttest_worker" and len(parts) <= 2


def test_agenttest_submit_imports_only_the_workers_faces() -> None:
    """The client uses the worker's packages through what they export (`from
    agenttest_worker.store import runs`), never a module inside one, so that a package
    can rearrange its modules without touching the client."""
    inside = [
        str(i)
        for i in imports()
        if i.source.startswith("agenttest_submit.")
        and i.target.startswith("agenttest_worker.")
        and not _is_face(i.target)
    ]
    assert not inside, "agenttest_submit imports inside a worker package:\n" + "\n".join(inside)


def test_no_worker_module_imports_agenttest_submit() -> None:
    """Workers run without the client: nothing in agenttest_worker imports it."""
    upward = [
        str(i)
        for i in imports()
        if i.source.startswith("agenttest_worker") and i.target.startswith("agenttest_submit")
    ]
    assert not upward, "agenttest_worker imports agenttest_submit:\n" + "\n".join(upward)


def test_the_face_rule_sees_an_import_inside_a_package() -> None:
    assert _is_face("agenttest_worker.store") and _is_face("agenttest_worker.settings")
    assert not _is_face("agenttest_worker.store.sql.runs")


def test_no_two_modules_share_a_name() -> None:
    """A module's file name says what it holds, once in the project: two `history.py`
    were four subjects under one word."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for module in MODULES.values():
        if not module.is_package and module.path.stem not in ("__main__",):
            by_name[module.path.stem].append(module.where)
    shared = {name: wheres for name, wheres in by_name.items() if len(wheres) > 1}
    assert not shared, f"module names used twice: {shared}"


def test_no_module_is_over_500_lines() -> None:
    sizes = {
        m.where: len(m.path.read_text(encoding="utf-8").splitlines()) for m in MODULES.values()
    }
    over = {where: n for where, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: " + ", ".join(
        f"{where} ({n})" for where, n in over.items()
    )


def test_agenttest_worker_top_level_holds_few_modules() -> None:
    """Besides its packages: the few things everything shares."""
    top = sorted(
        p.name for p in (ROOT / "agenttest_worker").glob("*.py") if p.name != "__init__.py"
    )
    assert len(top) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(top)} modules at agenttest_worker's top level (at most {MAX_TOP_LEVEL_MODULES}): "
        + ", ".join(top)
    )


# -- packages say what they are for and what they export ------------------------------------

PACKAGE_MODULES = [m for m in MODULES.values() if m.is_package]


def _exports_nothing(tree: ast.Module) -> bool:
    """The __init__.py is its docstring (and `from __future__`) and nothing else."""
    body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    return all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in body)


def _declares_all(tree: ast.Module) -> bool:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return True
    return False


@pytest.mark.parametrize("package", PACKAGE_MODULES, ids=lambda m: m.name)
def test_every_package_says_what_it_is_for_and_what_it_exports(package: Module) -> None:
    """The rule: a package's __init__.py has a docstring, and either declares its public
    names in `__all__`, or exports nothing at all: it is only its docstring, and callers
    import its modules (store/ does so, to keep SQLAlchemy out of start-up). An
    __init__.py that imports or defines names without `__all__` is neither."""
    tree = _tree(package)
    docstring = (ast.get_docstring(tree) or "").strip()
    assert docstring, f"{package.where}: no docstring"
    assert _declares_all(tree) or _exports_nothing(tree), (
        f"{package.where}: imports or defines names but has no __all__"
    )


@pytest.mark.parametrize(
    "package", [p for p in PACKAGE_MODULES if _declares_all(_tree(p))], ids=lambda m: m.name
)
def test_every_name_a_package_exports_is_there(package: Module) -> None:
    """`from package import *` and readers of `__all__` find each name it lists: an
    attribute (lazy exports included) or a submodule, which `import *` imports."""
    imported = importlib.import_module(package.name)
    exported = list(imported.__all__)

    def there(name: str) -> bool:
        if hasattr(imported, name):
            return True
        try:
            importlib.import_module(f"{package.name}.{name}")
        except ModuleNotFoundError:
            return False
        return True

    missing = [name for name in exported if not there(name)]
    twice = sorted({name for name in exported if exported.count(name) > 1})
    assert not missing, f"{package.where}: __all__ lists names it lacks: {missing}"
    assert not twice, f"{package.where}: __all__ lists names twice: {twice}"


# -- docs/ARCHITECTURE.md names what exists -------------------------------------------------

# A backticked path: segments of letters, digits, `_`, `.` and `-`, separated by `/`.
_PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?")
# A table row whose first cell is a package: | `agenttest_worker/store/` | ... |
_ROW_PACKAGE = re.compile(r"^\|\s*`([\w./-]+/)`\s*\|")


def named_paths(text: str) -> list[tuple[int, str, str | None]]:
    """(line, path, the package of its table row or None) for each package or module
    the document names in backticks: a span that is a path and ends in `.py` or `/` or
    starts with a package's name (`application/json` or `{base_url}/chat` are not)."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        row = _ROW_PACKAGE.match(line)
        for span in re.findall(r"`([^`\n]+)`", line):
            if not _PATH.fullmatch(span):
                continue
            if span.endswith((".py", "/")) or span.split("/")[0] in PACKAGES:
                found.append((number, span, row.group(1) if row else None))
    return found


def _candidates(path: str, row_package: str | None) -> list[Path]:
    """Where a named path may be. A path with a directory in it is read from the
    repository root, agenttest_worker/ or agenttest_submit/ (`store/turns.py`), or its
    table row's package; a bare name (`turns.py`, `protocols/`) is in its table row's
    package, or outside a table anywhere in the two packages."""
    bare = "/" not in path.rstrip("/")
    if bare and row_package:
        return [ROOT / row_package / path]
    if bare:
        name = path.rstrip("/")
        return [ROOT / path, *(p for package in PACKAGES for p in (ROOT / package).rglob(name))]
    bases = [ROOT, *(ROOT / package for package in PACKAGES)]
    if row_package:
        bases.append(ROOT / row_package)
    return [base / path for base in bases]


def _exists(candidate: Path, path: str) -> bool:
    """A module is a file; a directory inside the packages must be a package (a folder
    left with only __pycache__ after a move is not)."""
    if "__pycache__" in candidate.parts:
        return False
    if not path.endswith("/"):
        return candidate.is_file()
    inside = any(candidate.is_relative_to(ROOT / package) for package in PACKAGES)
    return candidate.is_dir() and (not inside or (candidate / "__init__.py").is_file())


def test_architecture_md_names_only_what_exists() -> None:
    assert ARCHITECTURE.is_file(), (
        "docs/ARCHITECTURE.md is missing: it describes the data flow, where each concept "
        "lives, the extension points and the invariants (issue 17)"
    )
    named = named_paths(ARCHITECTURE.read_text(encoding="utf-8"))
    assert named, "docs/ARCHITECTURE.md names no package or module in backticks"
    missing = [
        f"line {number}: `{path}`" + (f" (in the row of `{row}`)" if row else "")
        for number, path, row in named
        if not any(_exists(c, path) for c in _candidates(path, row))
    ]
    assert not missing, "docs/ARCHITECTURE.md names what does not exist:\n" + "\n".join(missing)


def test_architecture_md_lists_every_module() -> None:
    """One line per module: a newcomer finds any module, and what it is for, in one hop."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    listed = {span for _, span, _ in named_paths(text)}
    unlisted = [
        module.where
        for module in MODULES.values()
        if not module.is_package
        and "versions" not in module.path.parts
        and module.path.name not in listed
        and module.where not in listed
    ]
    assert not unlisted, "docs/ARCHITECTURE.md does not list:\n" + "\n".join(unlisted)


def test_named_paths_are_the_backticked_packages_and_modules() -> None:
    text = (
        "| `agenttest_worker/store/` | the hot path (`turns.py`), `migrations/` |\n"
        "`store/turns.py`, `agenttest_worker/engine/`, `engine.RunOptions`,\n"
        "`application/json`, `{base_url}/chat/completions`, `pytest -q`, `tests/`\n"
    )
    store = "agenttest_worker/store/"
    assert named_paths(text) == [
        (1, "agenttest_worker/store/", store),
        (1, "turns.py", store),
        (1, "migrations/", store),
        (2, "store/turns.py", None),
        (2, "agenttest_worker/engine/", None),
        (3, "tests/", None),
    ]
