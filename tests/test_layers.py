"""Imports point one way, in layers (docs/architecture.md "Layout").

``dashboard`` → ``jobs`` → (``billing``, ``environments``, ``sandboxes``) → ``lab``. ``billing`` and
``environments`` are independent of each other. ``lab`` names the apps above it only in its
composition root. ``engine``, ``labsdk`` and ``lab_environments`` (the environment protocol) are
libraries that any app may use and that never import Django or an app. ``demo`` is a client
program: it may import anything, nothing imports it.

The walk reads every import statement (those inside functions too) and the dotted paths handed
to ``include()``, ``import_module()`` and ``import_string()``, and reports every offending
file:line at once.

Below the layers, the module graph of the apps and libraries (imports inside functions count as
edges; ``if TYPE_CHECKING:`` blocks do not) may hold no import circle but the ones listed in
``KNOWN_IMPORT_CIRCLES``, and no import of a project module inside a function but the ones listed
in ``FUNCTION_LEVEL_IMPORTS``. Both lists may only shrink: a circle that is broken, or an import
that moves to the top of its module, fails the test until its entry goes. Each test prints what
it measured (``pytest -rA tests/test_layers.py`` or ``-s``).
"""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Where each part of the code lives, relative to the repository root.
PACKAGES = {
    "lab": "lab",
    "dashboard": "dashboard",
    "jobs": "jobs",
    "billing": "billing",
    "environments": "environments",
    "sandboxes": "sandboxes",
    "serving": "serving",
    "evaluations": "evaluations",
    "engine": "engine",
    "labsdk": "sdk/labsdk",
    "lab_environments": "sdk/lab-environments/lab_environments",
    "demo": "demo",
}
DJANGO = {"django", "rest_framework"}
APPS = {"dashboard", "evaluations", "jobs", "billing", "environments", "sandboxes", "serving"}
LIBRARIES = {"engine", "labsdk", "lab_environments"}

#: What each part may import besides itself, the standard library and third-party packages.
ALLOWED = {
    "dashboard": {"serving", "evaluations", "sandboxes", "jobs", "billing", "environments", "lab"} | LIBRARIES | DJANGO,
    # Evaluations run as jobs of their own kind: above jobs, below the dashboard; a deployment is
    # evaluated through its OpenAI-compatible API, so evaluations read serving's deployments.
    "evaluations": {"serving", "jobs", "billing", "environments", "lab"} | LIBRARIES | DJANGO,
    # Deployments serve jobs' checkpoints and adapters: above jobs, below the dashboard.
    "serving": {"jobs", "billing", "environments", "lab"} | LIBRARIES | DJANGO,
    # A job attempt's engine makes sandboxes (an environment scoring rollouts): jobs above sandboxes.
    "jobs": {"sandboxes", "billing", "environments", "lab"} | LIBRARIES | DJANGO,
    "billing": {"lab"} | LIBRARIES | DJANGO,
    "environments": {"lab"} | LIBRARIES | DJANGO,
    # Sandboxes are billed (their cores and memory on the usage ledger): sandboxes above billing.
    "sandboxes": {"billing", "lab"} | LIBRARIES | DJANGO,
    "lab": LIBRARIES | DJANGO,
    "engine": {"labsdk", "lab_environments"},
    # The SDK is installed on its own (sdk/pyproject.toml): nothing else of this repository.
    "labsdk": set(),
    # The environment protocol (sdk/lab-environments) is the standard library only.
    "lab_environments": set(),
    "demo": set(PACKAGES) | DJANGO,
}
#: Watched names: an import of anything else (stdlib, third party) is never a layer problem.
WATCHED = set(PACKAGES) | DJANGO

#: lab's composition root, which may name every app (never the demo).
COMPOSITION_ROOT = {"lab/settings.py", "lab/urls.py", "lab/asgi.py", "lab/wsgi.py", "lab/celery.py"}

#: Calls whose first argument is a dotted module path imported at run time.
DYNAMIC_IMPORTS = {"include", "import_module", "import_string"}


def _module_name(path: Path, package_dir: Path, package: str) -> list[str]:
    relative = path.relative_to(package_dir).with_suffix("")
    parts = [package, *relative.parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def _from_module(node: ast.ImportFrom, module_parts: list[str], is_package: bool) -> str:
    """Return the dotted module a ``from ... import`` reads from, relative ones resolved against
    the importing module (``module_parts``; ``is_package`` when it is a package's ``__init__``)."""
    if node.level == 0:
        return node.module or ""
    base = module_parts if is_package else module_parts[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_modules(path: Path, *, package: str, package_dir: Path) -> list[tuple[int, str]]:
    """Return ``(line, dotted module)`` for every import in the file at ``path``.

    Relative imports are resolved against the file's own package; dynamic imports count when
    their module is a string literal.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    module_parts = _module_name(path, package_dir, package)
    is_package = path.name == "__init__.py"
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, _from_module(node, module_parts, is_package)))
        elif (dynamic := _dynamic_import(node)) is not None:
            found.append((node.lineno, dynamic))
    return found


def _dynamic_import(node: ast.AST) -> str | None:
    """Return the dotted path ``node`` imports when it is a call in ``DYNAMIC_IMPORTS`` with a
    string literal first, else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    function = node.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
    first = node.args[0]
    if name in DYNAMIC_IMPORTS and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def layer_violations(root: Path = ROOT) -> list[str]:
    """Return ``"path:line: what is wrong"`` for every import that breaks the layers under ``root``."""
    problems = []
    for package, directory in PACKAGES.items():
        package_dir = root / directory
        for path in sorted(package_dir.rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            allowed = ALLOWED[package]
            if relative in COMPOSITION_ROOT:
                allowed = allowed | APPS
            for line, module in imported_modules(path, package=package, package_dir=package_dir):
                target = module.split(".")[0]
                if target == package or target not in WATCHED or target in allowed:
                    continue
                problems.append(f"{relative}:{line}: {package} imports {module}")
    return problems


def test_it_keeps_every_import_in_its_layer():
    problems = layer_violations()
    if problems:
        pytest.fail("imports that break the layers (docs/architecture.md):\n" + "\n".join(problems), pytrace=False)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return tmp_path


def test_it_reports_imports_inside_functions_and_dynamic_ones(tmp_path):
    root = _tree(
        tmp_path,
        {
            "lab/__init__.py": "",
            "lab/ops.py": "import os\n\ndef count():\n    from jobs.models import Job\n    return Job\n",
            "lab/api/urls.py": "from django.urls import include\nurls = [include('jobs.api.urls')]\n",
            "lab/urls.py": "from django.urls import include\nurls = [include('dashboard.urls')]\n",
            "billing/models.py": "import environments.models\n",
            "engine/run.py": "def main():\n    import django\n",
            "sdk/labsdk/client.py": "from engine import catalog\n",
            "jobs/services.py": "from . import models\nfrom ..demo import program\n",
            "demo/program.py": "import jobs.models\nimport dashboard\n",
        },
    )
    assert layer_violations(root) == [
        "lab/api/urls.py:2: lab imports jobs.api.urls",
        "lab/ops.py:4: lab imports jobs.models",
        "jobs/services.py:2: jobs imports demo",
        "billing/models.py:1: billing imports environments.models",
        "engine/run.py:2: engine imports django",
        "sdk/labsdk/client.py:1: labsdk imports engine",
    ]


# ---- The module graph: import circles and imports inside functions ----

#: The packages whose modules form the graph: the apps and the libraries (the demo is a client
#: program that nothing imports).
GRAPH_PACKAGES = {package: directory for package, directory in PACKAGES.items() if package != "demo"}

#: The import circles there are today, each the set of modules in it. A circle may shrink or
#: go, never grow; no other may appear. Every one closes through imports inside functions
#: (``FUNCTION_LEVEL_IMPORTS`` says which).
KNOWN_IMPORT_CIRCLES: set[frozenset[str]] = set()

_DISTILL = "distillation only: distill brings pydantic, absent where the in-process orchestrator runs bare (bench/gpu_check.sh)"
_KUBERNETES = "the Kubernetes pool loads only with LAB_LAUNCHER=kubernetes"

#: Imports of a project module inside a function there are today, (importing module, imported
#: module) with the reason it is not at the top: each hides an edge of the graph, so none may be
#: added and the list only shrinks.
FUNCTION_LEVEL_IMPORTS = {
    ("engine.commands.try_environment", "engine.commands.try_model"): (
        "lab envs try loads and scores a package without torch; only a reply sampled by --model needs it"
    ),
    ("engine.commands.evaluate", "engine.evaluation"): (
        "the evaluator brings transformers and peft: imported once the attempt's input is valid, so a refused one exits without them"
    ),
    ("engine.commands.run", "engine.commands.train"): (
        "the trainer brings transformers and peft: imported once the attempt's input is valid, so a refused one exits without them"
    ),
    ("engine.orchestrator", "engine.distill"): _DISTILL,
    ("jobs.apps", "jobs.metrics"): "AppConfig.ready(): jobs.metrics imports jobs.models",
    ("jobs.launchers.registry", "jobs.launchers.kubernetes.gateway"): _KUBERNETES,
    ("jobs.launchers.registry", "jobs.launchers.kubernetes.launcher"): _KUBERNETES,
    ("jobs.launchers.registry", "jobs.launchers.kubernetes.objects"): _KUBERNETES,
    ("lab.apps", "lab.checks"): "AppConfig.ready(): importing lab.checks registers Lab's system checks",
}


def _tests_type_checking(test: ast.expr) -> bool:
    """Whether an ``if`` tests ``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` (its body never runs)."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def run_time_imports(
    tree: ast.Module, *, module_parts: list[str], is_package: bool
) -> list[tuple[int, tuple[str, ...], bool]]:
    """Return ``(line, dotted names, inside a function)`` for every import in ``tree`` that can run.

    ``if TYPE_CHECKING:`` bodies are left out (their ``else`` is kept). A dotted name is a module or
    a name in one: ``from jobs import tasks`` gives ``jobs.tasks``, ``from jobs.models import Job``
    ``jobs.models.Job`` (`module_graph` keeps the longest prefix that is a module). Dynamic
    imports count as in `imported_modules`. ``module_parts`` and ``is_package`` resolve relative
    imports.
    """
    found = []
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, in_function = stack.pop()
        if isinstance(node, ast.Import):
            found.append((node.lineno, tuple(alias.name for alias in node.names), in_function))
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, module_parts, is_package)
            found.append((node.lineno, tuple(f"{module}.{alias.name}" for alias in node.names), in_function))
        elif (dynamic := _dynamic_import(node)) is not None:
            found.append((node.lineno, (dynamic,), in_function))
        skipped = isinstance(node, ast.If) and _tests_type_checking(node.test)
        children = node.orelse if skipped else ast.iter_child_nodes(node)
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        stack.extend((child, inside) for child in children)
    return sorted(found)


def _containing_module(name: str, modules: dict[str, Path]) -> str | None:
    """Return the longest prefix of the dotted ``name`` that is one of ``modules``, or None."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@dataclass(frozen=True)
class ModuleGraph:
    """Who imports whom among the modules of ``GRAPH_PACKAGES`` (a package's ``__init__`` is the
    package's module).

    ``edges[module]`` holds every module it imports, at its top or inside a function;
    ``in_functions[(module, imported)]`` lists where (``"path:line"``) it imports one inside a
    function.
    """

    edges: dict[str, set[str]]
    in_functions: dict[tuple[str, str], list[str]]


def module_graph(root: Path = ROOT) -> ModuleGraph:
    """Parse every module of ``GRAPH_PACKAGES`` under ``root`` (nothing is imported) into its graph.

    An import of ``a.b.c`` is an edge to ``a.b.c`` alone, as in import-linter's graph: not to the
    packages ``a`` and ``a.b`` whose ``__init__`` Python runs first (else every package whose
    ``__init__`` re-exports a submodule would be a circle).
    """
    files: dict[str, Path] = {}
    for package, directory in GRAPH_PACKAGES.items():
        package_dir = root / directory
        for path in sorted(package_dir.rglob("*.py")):
            files[".".join(_module_name(path, package_dir, package))] = path
    edges: dict[str, set[str]] = {module: set() for module in files}
    in_functions: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for line, names, in_function in run_time_imports(tree, module_parts=module.split("."), is_package=is_package):
            for imported in sorted({_containing_module(name, files) for name in names} - {None, module}):
                edges[module].add(imported)
                if in_function:
                    in_functions[(module, imported)].append(f"{path.relative_to(root).as_posix()}:{line}")
    return ModuleGraph(edges=edges, in_functions=dict(in_functions))


@cache
def _project_graph() -> ModuleGraph:
    return module_graph(ROOT)


def strongly_connected_components(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Return the strongly connected components of the graph ``edges`` (Tarjan's algorithm,
    iterative so that a deep import chain cannot reach Python's recursion limit).

    Every node is in exactly one component; nodes that only appear as targets count too.
    """
    nodes = sorted(set(edges) | {target for targets in edges.values() for target in targets})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[frozenset[str]] = []
    for start in nodes:
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(sorted(edges.get(start, ()))))]
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(frozenset(component))
    return components


def import_circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Return every strongly connected component of more than one module, largest first."""
    circles = [component for component in strongly_connected_components(edges) if len(component) > 1]
    return sorted(circles, key=lambda circle: (-len(circle), sorted(circle)))


def _names(modules: frozenset[str]) -> str:
    return ", ".join(sorted(modules))


def circles_summary(circles: list[frozenset[str]]) -> str:
    """Describe ``circles`` for a reader: how many, their sizes, and the modules of each."""
    sizes = ", ".join(str(len(circle)) for circle in circles)
    lines = [f"{len(circles)} import circles over {', '.join(GRAPH_PACKAGES)} ({sizes} modules)"]
    lines += [f"  {len(circle)}: {_names(circle)}" for circle in circles]
    return "\n".join(lines)


def circle_problems(measured: list[frozenset[str]], known: set[frozenset[str]]) -> list[str]:
    """Return what ``measured`` circles break of the ``known`` ones: a circle that is new or grew,
    and a known one that is gone or smaller (its entry is stale)."""
    problems = []
    for circle in measured:
        if circle in known or any(circle < listed for listed in known):
            continue  # a listed circle that shrank or split is reported below, as that entry
        taken_in = sorted(len(listed) for listed in known if listed & circle)
        grown = f" (it takes in listed circles of {', '.join(map(str, taken_in))} modules)" if taken_in else ""
        problems.append(f"new import circle of {len(circle)} modules{grown}: {_names(circle)}")
    for listed in sorted(known, key=lambda circle: (-len(circle), sorted(circle))):
        if listed in measured or any(listed < circle for circle in measured):
            continue  # unchanged, or grown (reported above)
        left = [circle for circle in measured if circle < listed]
        remedy = (
            "replace it in KNOWN_IMPORT_CIRCLES by " + " and ".join(f"{{{_names(circle)}}}" for circle in left)
            if left
            else "remove it from KNOWN_IMPORT_CIRCLES"
        )
        problems.append(f"the listed circle of {len(listed)} modules is smaller or gone ({_names(listed)}): {remedy}")
    return problems


def function_level_summary(in_functions: dict[tuple[str, str], list[str]]) -> str:
    """Count imports of project modules inside functions (one per importing and imported module),
    in all and by the importing module's package."""
    by_package = Counter(importer.split(".")[0] for importer, _ in in_functions)
    lines = sum(len(where) for where in in_functions.values())
    counts = ", ".join(f"{package} {by_package[package]}" for package in GRAPH_PACKAGES)
    return f"{len(in_functions)} function-level imports of project modules ({lines} import lines): {counts}"


def function_level_problems(
    in_functions: dict[tuple[str, str], list[str]], allowed: dict[tuple[str, str], str]
) -> list[str]:
    """Return the imports inside functions that ``allowed`` does not list, and its stale entries."""
    problems = [
        f"{', '.join(where)}: {importer} imports {imported} inside a function: import it at the top of the module, "
        "or list it in FUNCTION_LEVEL_IMPORTS with the reason it cannot be"
        for (importer, imported), where in sorted(in_functions.items())
        if (importer, imported) not in allowed
    ]
    problems += [
        f"{importer} no longer imports {imported} inside a function: remove it from FUNCTION_LEVEL_IMPORTS"
        for importer, imported in sorted(allowed)
        if (importer, imported) not in in_functions
    ]
    return problems


def test_it_finds_no_import_circle_but_the_known_ones():
    circles = import_circles(_project_graph().edges)
    summary = circles_summary(circles)
    print(summary)
    problems = circle_problems(circles, KNOWN_IMPORT_CIRCLES)
    if problems:
        pytest.fail(summary + "\n" + "\n".join(problems), pytrace=False)


def test_it_allows_only_the_listed_imports_inside_functions():
    in_functions = _project_graph().in_functions
    summary = function_level_summary(in_functions)
    print(summary)
    problems = function_level_problems(in_functions, FUNCTION_LEVEL_IMPORTS)
    if problems:
        pytest.fail(summary + f" ({len(FUNCTION_LEVEL_IMPORTS)} listed)\n" + "\n".join(problems), pytrace=False)


def test_it_finds_circles_through_imports_inside_functions_and_leaves_out_type_checking(tmp_path):
    root = _tree(
        tmp_path,
        {
            "jobs/__init__.py": "",
            "jobs/a.py": "from jobs import b, d\n",
            "jobs/b.py": "import os\n\ndef f():\n    from jobs.c import thing\n    return thing\n",
            "jobs/c.py": "from . import a\nthing = 1\n",
            "jobs/d.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from jobs import a\nelse:\n    import jobs.e\n"
            ),
            "jobs/e.py": "import typing\nif typing.TYPE_CHECKING:\n    import jobs.d\n",
            "engine/__init__.py": "from engine.packages import install\n",
            "engine/packages.py": "import engine\n\ndef install():\n    pass\n",
            "lab/x.py": "import lab.y\n",
            "lab/y.py": "from importlib import import_module\n\ndef load():\n    return import_module('lab.x')\n",
            "sdk/labsdk/one.py": "from labsdk import two\n",
            "sdk/labsdk/two.py": "import httpx\n",
            "demo/program.py": "import jobs.a\n\ndef main():\n    import jobs.b\n",
        },
    )
    graph = module_graph(root)
    assert import_circles(graph.edges) == [
        frozenset({"jobs.a", "jobs.b", "jobs.c"}),
        frozenset({"engine", "engine.packages"}),
        frozenset({"lab.x", "lab.y"}),
    ]
    assert graph.edges["jobs.d"] == {"jobs.e"}
    assert graph.edges["jobs.e"] == set()
    assert graph.edges["labsdk.one"] == {"labsdk.two"}
    assert graph.in_functions == {("jobs.b", "jobs.c"): ["jobs/b.py:4"], ("lab.y", "lab.x"): ["lab/y.py:4"]}
    assert "demo.program" not in graph.edges


def test_it_finds_every_strongly_connected_component():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d", "f"}, "g": {"g"}}
    assert sorted(map(sorted, strongly_connected_components(edges))) == [["a", "b", "c"], ["d", "e"], ["f"], ["g"]]
    chain = {str(number): {str(number + 1)} for number in range(5000)} | {"5000": {"0"}}
    assert import_circles(chain) == [frozenset(map(str, range(5001)))]


def test_it_reports_a_new_or_grown_circle_and_a_listed_one_that_shrank_or_went():
    known = {frozenset({"a", "b", "c"}), frozenset({"d", "e"}), frozenset({"f", "g"}), frozenset({"h", "i"})}
    measured = [frozenset({"a", "b"}), frozenset({"d", "e", "x"}), frozenset({"h", "i"}), frozenset({"y", "z"})]
    assert circle_problems(measured, known) == [
        "new import circle of 3 modules (it takes in listed circles of 2 modules): d, e, x",
        "new import circle of 2 modules: y, z",
        "the listed circle of 3 modules is smaller or gone (a, b, c): replace it in KNOWN_IMPORT_CIRCLES by {a, b}",
        "the listed circle of 2 modules is smaller or gone (f, g): remove it from KNOWN_IMPORT_CIRCLES",
    ]
    assert circle_problems(sorted(known, key=sorted), known) == []


def test_it_reports_an_unlisted_import_inside_a_function_and_a_stale_entry():
    found = {("jobs.a", "jobs.b"): ["jobs/a.py:4", "jobs/a.py:9"], ("jobs.c", "lab.d"): ["jobs/c.py:2"]}
    allowed = {("jobs.c", "lab.d"): "a reason", ("engine.e", "engine.f"): "a reason"}
    assert function_level_problems(found, allowed) == [
        (
            "jobs/a.py:4, jobs/a.py:9: jobs.a imports jobs.b inside a function: import it at the top of the module, "
            "or list it in FUNCTION_LEVEL_IMPORTS with the reason it cannot be"
        ),
        "engine.e no longer imports engine.f inside a function: remove it from FUNCTION_LEVEL_IMPORTS",
    ]
    assert function_level_summary(found) == (
        "2 function-level imports of project modules (3 import lines): "
        "lab 0, dashboard 0, jobs 2, billing 0, environments 0, sandboxes 0, serving 0, evaluations 0, engine 0, labsdk 0, lab_environments 0"
    )


#: The HTTP edge, which alone may import ``lab.api`` (the API's errors, auth, paging, schema):
#: modules in an ``api`` package, views, URL confs, OpenAPI declarations, Celery tasks, the
#: composition root and middleware, the ingest endpoint that opens attempts, and the dashboard.
#: Every other module is the domain: it raises ``lab.errors.LabError`` and reads ``lab.paging``,
#: ``lab.formats`` and ``lab.lib.jsonbounds``.
API_EDGE_NAMES = {"views.py", "urls.py", "openapi.py", "tasks.py"}
API_EDGE_MODULES = {"lab/settings.py", "lab/middleware.py", "jobs/ingest/bootstrap.py"}
API_EDGE_PACKAGES = {"dashboard"}


def _is_api_edge(relative: str) -> bool:
    parts = relative.split("/")
    return (
        parts[0] in API_EDGE_PACKAGES
        or "api" in parts[:-1]
        or parts[-1] in API_EDGE_NAMES
        or parts[-1].endswith("_views.py")
        or relative in API_EDGE_MODULES
    )


def test_it_keeps_lab_api_out_of_the_domain():
    problems = []
    for package in APPS | {"lab"}:
        package_dir = ROOT / PACKAGES[package]
        for path in sorted(package_dir.rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if _is_api_edge(relative) or "/migrations/" in relative:
                continue
            for line, module in imported_modules(path, package=package, package_dir=package_dir):
                if module == "lab.api" or module.startswith("lab.api."):
                    problems.append(f"{relative}:{line}: imports {module}")
    assert not problems, "domain modules that import the API layer (raise lab.errors.LabError):\n" + "\n".join(
        sorted(problems)
    )


def test_test_modules_share_helpers_through_tests_support():
    """No module under ``tests/`` imports a ``test_*`` module, and a helper module outside
    ``tests/support/`` (conftests aside) is imported from its own directory only: what several
    directories share lives in ``tests/support/``."""
    tests_dir = ROOT / "tests"
    problems = []
    for path in sorted(tests_dir.rglob("*.py")):
        relative = path.relative_to(ROOT)
        package = ".".join(relative.parent.parts)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*parent, *([base] if base else [])])
                # ``from tests.jobs import test_x`` names a module in the imported names.
                modules = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[0] != "tests" or not (ROOT / Path(*parts)).with_suffix(".py").is_file():
                    continue
                where = f"{relative.as_posix()}:{node.lineno}: imports {module}"
                if parts[-1].startswith("test_"):
                    problems.append(f"{where}, a test module")
                elif parts[1] != "support" and parts[-1] != "conftest" and ".".join(parts[:-1]) != package:
                    problems.append(f"{where}, a helper of another directory (move it to tests/support/)")
    print(f"checked {sum(1 for _ in tests_dir.rglob('*.py'))} modules under tests/")
    assert not problems, "test modules that import tests instead of tests/support/:\n" + "\n".join(problems)


#: The parts whose modules keep to one role and to ``MAX_MODULE_LINES`` (the dashboard's views
#: and the demo, which read top to bottom as pages and a script, are not held to it).
SIZED = ("lab", "jobs", "billing", "environments", "sandboxes", "engine", "labsdk")
MAX_MODULE_LINES = 500

#: Modules over ``MAX_MODULE_LINES``, with the reason each stays whole. The list only shrinks.
LONG_MODULES = {
    "engine/environments/load_environment_bridge.py": (
        "one program run as `python -I load_environment_bridge.py` with a build's own Python (verifiers 0.3.1's "
        "API, or 0.1.9's): it imports no module beside it but bridge_protocol.py and probe.py (standard library "
        "only), loaded by their paths"
    ),
    "engine/environments/verifiers_bridge.py": (
        "one program run as `python -I verifiers_bridge.py` with the verifiers environment's Python: "
        "it imports no module beside it but bridge_protocol.py, the protocol it shares with the load_environment bridge, "
        "and probe.py (standard library only), loaded by their paths"
    ),
    "lab/settings.py": (
        "one role: Django's settings, each read from the environment once beside the comment that says "
        "what it does, grouped by app as docs/configuration.md lists them"
    ),
    "jobs/launchers/kubernetes/objects.py": (
        "one role: the pure functions that build an attempt's Kubernetes objects (JobSet, Services, "
        "NetworkPolicy, Secret), read beside docs/kubernetes.md"
    ),
    "sdk/labsdk/spec/model.py": (
        "one role: the job spec's pydantic model, a class per spec table with its validators, in the "
        "order of docs/spec.md"
    ),
}


def module_lengths() -> dict[str, int]:
    """Return the line count of every module of ``SIZED``, by its path from the repository root."""
    lengths = {}
    for package in SIZED:
        for path in sorted((ROOT / PACKAGES[package]).rglob("*.py")):
            if "migrations" not in path.parts:
                lengths[path.relative_to(ROOT).as_posix()] = len(path.read_text(encoding="utf-8").splitlines())
    return lengths


def test_no_module_is_longer_than_500_lines_but_the_listed_ones():
    lengths = module_lengths()
    print({name: lines for name, lines in sorted(lengths.items(), key=lambda item: -item[1])[:10]})
    long = sorted(
        f"{name} ({lines} lines)" for name, lines in lengths.items() if lines > MAX_MODULE_LINES and name not in LONG_MODULES
    )
    assert not long, "split by responsibility, or list with the reason in LONG_MODULES: " + ", ".join(long)
    stale = sorted(name for name in LONG_MODULES if lengths.get(name, 0) <= MAX_MODULE_LINES)
    assert not stale, f"no longer over {MAX_MODULE_LINES} lines: remove from LONG_MODULES: {', '.join(stale)}"
