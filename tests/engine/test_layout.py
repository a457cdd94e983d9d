"""The engine's floor plan (engine/README.md): one reading of the environment, roles that import
none of each other (module lengths: tests/test_layers.py).

Both tests parse the engine's modules (nothing is imported) and report every offending place at once.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"

#: The modules that may read or write the process environment: the engine's configuration, its
#: command line, and the programs of their own run with an environment's Python (`python -I`),
#: which never import the engine: the verifiers bridge and the import probe.
ENVIRONMENT_READERS = {"config.py", "cli.py", "environments/verifiers_bridge.py", "environments/probe.py"}

#: The environment functions of `os` besides `os.environ` itself.
_OS_ENVIRONMENT_CALLS = {"getenv", "putenv", "unsetenv", "getenvb", "environb"}

def _engine_modules() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


def environment_uses(path: Path) -> list[int]:
    """Return the lines of `path` that touch the process environment through `os`: `os.environ`,
    `os.getenv()` and the like, or a name imported from `os` for it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            if node.attr == "environ" or node.attr in _OS_ENVIRONMENT_CALLS:
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name == "environ" or alias.name in _OS_ENVIRONMENT_CALLS for alias in node.names):
                lines.append(node.lineno)
    return sorted(lines)


def test_only_the_config_and_the_command_line_read_the_environment():
    found = [
        f"engine/{path.relative_to(ENGINE).as_posix()}:{line}"
        for path in _engine_modules()
        if path.relative_to(ENGINE).as_posix() not in ENVIRONMENT_READERS
        for line in environment_uses(path)
    ]
    assert not found, "read the environment through engine.config instead: " + ", ".join(found)


def test_the_check_finds_every_way_of_reading_the_environment(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        "import os\nfrom os import environ\n\nA = os.environ.get('A')\nB = os.getenv('B')\nos.environ['C'] = '1'\n"
        "D = {**os.environ}\nE = 'os.environ in a string'\n"
    )
    assert environment_uses(module) == [2, 4, 5, 6, 7]


#: The modules of each role (prime-rl's trainer, orchestrator and inference). A role's modules
#: import no other role's; the entry points (engine/cli.py, engine/commands/) and the rollout
#: sources that join two roles in one process (engine/colocated.py, engine/trainer_role.py)
#: compose them. Shared below them: config, catalog, models, policy, distributed, groups, rollout, ...
ROLES = {
    "trainer": {"engine.trainer", "engine.checkpoints", "engine.grpo", "engine.filters"},
    "orchestrator": {"engine.orchestrator", "engine.multi_turn", "engine.distill", "engine.roles"},
    "inference": {"engine.inference", "engine.vllm_backend", "engine.remote_inference"},
}


def _run_time_imports(path: Path) -> set[str]:
    """The engine modules `path` imports (at its top or in a function, `if TYPE_CHECKING:` aside)."""
    found = set()
    stack = [ast.parse(path.read_text(encoding="utf-8"))]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return {name for name in found if name.startswith("engine.")}


def test_the_trainer_orchestrator_and_inference_roles_import_none_of_each_other():
    crossings = []
    for role, modules in ROLES.items():
        others = set().union(*(members for other, members in ROLES.items() if other != role))
        for module in sorted(modules):
            path = ENGINE.parent / (module.replace(".", "/") + ".py")
            crossings += [f"{module} ({role}) imports {name}" for name in sorted(_run_time_imports(path) & others)]
    assert not crossings, "compose the roles in an entry point instead: " + "; ".join(crossings)
