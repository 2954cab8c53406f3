"""The package's modules import each other without cycles, counting every import, lazy ones inside functions too."""

import ast
from pathlib import Path

import vanilla_transformer


PACKAGE_DIR = Path(vanilla_transformer.__file__).parent


def import_graph() -> dict[str, set[str]]:
    """Module name (relative to the package, "" for the package itself) -> the package modules it imports."""
    modules = {
        ".".join(path.relative_to(PACKAGE_DIR).with_suffix("").parts).removesuffix("__init__").rstrip("."): path
        for path in PACKAGE_DIR.rglob("*.py")
    }
    graph = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        package = [part for part in package if part]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:  # from .x import y, from . import x
                    base = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
                elif (node.module or "").split(".")[0] == "vanilla_transformer":
                    base = node.module.split(".")[1:]
                else:
                    continue
                for alias in node.names:  # a submodule, or a name from the module `base`
                    submodule = ".".join([*base, alias.name])
                    imported.add(submodule if submodule in modules else ".".join(base))
            elif isinstance(node, ast.Import):
                imported.update(".".join(alias.name.split(".")[1:]) for alias in node.names
                                if alias.name.split(".")[0] == "vanilla_transformer")
        graph[name] = {module for module in imported if module in modules} - {name}
    return graph


def test_no_import_cycles():
    graph = import_graph()
    assert {"", "cli.main", "model.modeling_vanilla_transformer"} <= set(graph)  # the walk found the package
    visiting, done = [], set()

    def visit(module):
        visiting.append(module)
        for target in sorted(graph[module]):
            assert target not in visiting, "import cycle: " + " -> ".join(visiting[visiting.index(target):] + [target])
            if target not in done:
                visit(target)
        visiting.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
