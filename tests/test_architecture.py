"""The package's shape, read from its source with `ast` (nothing is imported): the sealed model folder, the layer
order of the folders, and the size limits of modules and functions (test_package_imports.py checks for import
cycles). docs/internals.md opens with the same map in words."""

import ast
import re
import sys
from pathlib import Path

PACKAGE = "vanilla_transformer"
ROOT = Path(__file__).resolve().parents[1] / "src" / PACKAGE

# The layers, bottom first: a module imports only from its own layer and the layers below it. "" is the bottom
# layer: the plain modules directly in the package folder (errors, file checks, extras) that every folder may use.
LAYERS = ("", "paths", "model", "hub", "inference", "backends", "training", "train_run", "demo", "web", "cli")
# The package's own __init__.py (the public API) imports the model only.
PACKAGE_INIT_MAY_IMPORT = ("model",)
# model/ is exactly what `save_pretrained` copies next to every model, so it must load with nothing of the package
# around it: its files import each other (relatively) and these distributions, and the standard library.
MODEL_FILES = ("__init__.py", "configuration_vanilla_transformer.py", "modeling_vanilla_transformer.py",
               "generation_vanilla_transformer.py", "decoding_vanilla_transformer.py", "pipeline_vanilla_transformer.py")
MODEL_DEPENDENCIES = ("torch", "transformers", "huggingface_hub", "packaging")
MAX_MODULE_LINES = 400
LONGER_MODULES_ALLOWED = ("model/modeling_vanilla_transformer.py",)
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = sorted(ROOT.rglob("*.py"))
MODULES = {module_name(path): path for path in FILES}


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def layer(module: str) -> str:
    """The layer of a module of the package: its folder, or "" for a plain module of the package folder."""
    parts = module.split(".")[1:]
    return parts[0] if len(parts) > 1 or (parts and parts[0] in LAYERS) else ""


class Import:
    """One imported name: where (`path`, `line`, the statement as `text`), what (`module`, absolute), and whether it
    runs when its module is imported (`top_level`: not inside a function nor under `if TYPE_CHECKING`)."""

    def __init__(self, path: Path, node: ast.stmt, module: str, top_level: bool):
        self.path, self.line, self.module, self.top_level = path, node.lineno, module, top_level
        self.text = ast.unparse(node)
        self.relative = isinstance(node, ast.ImportFrom) and node.level > 0

    def __str__(self):
        return f"{relative(self.path)}:{self.line}: `{self.text}`"


def imports(path: Path) -> list[Import]:
    """Every import statement of `path`, one `Import` per module it names. `from PACKAGE import name` names the
    submodule PACKAGE.name when there is one, else PACKAGE itself."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []

    def visit(node: ast.AST, top_level: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend(Import(path, child, alias.name, top_level) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                for alias in child.names:
                    submodule = f"{base}.{alias.name}"
                    found.append(Import(path, child, submodule if submodule in MODULES else base, top_level))
            else:
                deferred = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
                    isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
                visit(child, top_level and not deferred)

    visit(ast.parse(path.read_text(), filename=str(path)), top_level=True)
    return list({(record.line, record.module): record for record in found}.values())


def own(imported: list[Import]) -> list[Import]:
    return [record for record in imported if record.module.split(".")[0] == PACKAGE]


def test_the_model_folder_holds_the_files_saved_with_a_model_and_imports_nothing_else_of_the_package():
    folder = ROOT / "model"
    assert sorted(path.name for path in folder.glob("*.py")) == sorted(MODEL_FILES)
    distributions = {*MODEL_DEPENDENCIES, *sys.stdlib_module_names}
    offenders = []
    for path in sorted(folder.glob("*.py")):
        for record in imports(path):
            top = record.module.split(".")[0]
            if top == PACKAGE and not (record.relative and layer(record.module) == "model"):
                offenders.append(f"{record} (model/ imports only its siblings, relatively)")
            elif top != PACKAGE and top not in distributions:
                offenders.append(f"{record} (model/ imports only {', '.join(MODEL_DEPENDENCIES)} and the stdlib)")
    assert not offenders, "\n".join(offenders)


def test_each_module_imports_only_its_own_layer_and_the_layers_below():
    offenders = []
    for module, path in MODULES.items():
        allowed = PACKAGE_INIT_MAY_IMPORT if module == PACKAGE else LAYERS[: LAYERS.index(layer(module)) + 1]
        for record in own(imports(path)):
            target = "model" if record.module == PACKAGE else layer(record.module)  # the package's __init__: the model
            if target not in allowed:
                offenders.append(f"{record} ({layer(module) or 'bottom'} imports {target or 'bottom'})")
    assert not offenders, "\n".join(["Layers, bottom first: " + " < ".join(name or "bottom" for name in LAYERS),
                                     *offenders])


def test_no_module_is_over_the_line_limit():
    offenders = [f"{relative(path)}: {lines} lines" for path in FILES
                 if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
                 and relative(path) not in LONGER_MODULES_ALLOWED]
    assert not offenders, f"Modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(offenders)


def test_no_function_is_over_the_line_limit():
    offenders = []
    for path in FILES:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    offenders.append(f"{relative(path)}:{node.lineno}: {node.name} ({length} lines)")
    assert not offenders, f"Functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)


def auto_loads_without_trust_remote_code(path: Path) -> list[str]:
    """The calls `AutoSomething.from_pretrained(...)` in `path` that do not pass `trust_remote_code=False`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "from_pretrained" and isinstance(node.func.value, ast.Name)
                and node.func.value.id.startswith("Auto")):
            continue
        passed = {keyword.arg: keyword.value for keyword in node.keywords}
        value = passed.get("trust_remote_code")
        if not (isinstance(value, ast.Constant) and value.value is False):
            found.append(f"{relative(path)}:{node.lineno}: `{ast.unparse(node)}`")
    return found


def test_every_auto_class_load_refuses_the_folders_own_code():
    # A saved folder names its code in `auto_map`; an Auto class given no `trust_remote_code` asks on standard input
    # whether to run it (where the package's own classes are not registered), which takes the lines a command was
    # piped to translate. The package registers its classes and loads with them, never asking.
    found = [call for path in FILES for call in auto_loads_without_trust_remote_code(path)]
    assert not found, "Auto classes that may ask whether to run a folder's code:\n" + "\n".join(found)


# The command line's layers: cli/, and the `train` command's plumbing and demo profile below it. They word what stops a
# command with its flags; the layers under them raise typed errors that carry their data, and their messages name
# values and files, never a flag (`cli/errors.py` adds those where a command has one).
COMMAND_LINE_LAYERS = ("train_run", "demo", "cli")
FLAG = re.compile(r"(?<![\w-])--[a-z]")


def raises_below_the_command_line():
    """Each `raise` statement of a module outside `COMMAND_LINE_LAYERS` but errors.py (where `UserError` and the means
    of raising one from another exception are defined), with its path."""
    for path in FILES:
        if layer(module_name(path)) in COMMAND_LINE_LAYERS or relative(path) == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                yield path, node


def test_below_the_command_line_errors_are_typed():
    found = [f"{relative(path)}:{node.lineno}: {ast.unparse(node)}" for path, node in raises_below_the_command_line()
             if isinstance(node.exc, ast.Call) and ast.unparse(node.exc.func).split(".")[-1] == "UserError"]
    assert not found, "A bare UserError below the command line (raise a typed subclass with its data):\n" + "\n".join(
        found)


def test_below_the_command_line_no_error_names_a_flag():
    found = []
    for path, node in raises_below_the_command_line():
        texts = [part.value for part in ast.walk(node.exc)
                 if isinstance(part, ast.Constant) and isinstance(part.value, str)]
        if any(FLAG.search(text) for text in texts):
            found.append(f"{relative(path)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "An error below the command line that names a command's flag:\n" + "\n".join(found)


def test_the_guard_finds_a_bare_user_error_and_a_flag():
    # The two checks above on a module of each kind, so that they cannot pass by finding nothing to read.
    node = ast.parse('raise UserError(f"--max-steps must be positive, got {value}")').body[0]
    assert isinstance(node, ast.Raise) and ast.unparse(node.exc.func) == "UserError"
    assert any(FLAG.search(part.value) for part in ast.walk(node.exc) if isinstance(part, ast.Constant))
    assert not FLAG.search("a--b") and not FLAG.search("---")
    assert sum(1 for _ in raises_below_the_command_line()) > 50
