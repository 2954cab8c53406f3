"""The package's optional dependencies. Loading a model, `generate()`, `pipeline("translation")` and the translate and
evaluate commands need only the core ones; each other feature imports its packages through `require`, so that a
missing one says which extra installs it: `train` (training, data loading, the number-words corpus, model cards,
the lowercased Moses-tokenized BLEU), `ct2` (the CTranslate2 export and backend), `onnx` (the ONNX export and
backend), `plots` (attention plots) and `demo` (the translation page in the browser: Gradio).
"""

import importlib
import importlib.metadata
import importlib.util
from types import ModuleType


class MissingExtraError(ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


def require(module: str, extra: str) -> ModuleType:
    """`module` imported, or a `MissingExtraError` saying `pip install 'vanilla-transformer[extra]'`."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        package = module.split(".")[0]
        if error.name is not None and error.name.split(".")[0] != package:
            raise  # the package is installed, one of its own dependencies is not: its error says which
        raise _missing(package, extra) from None


def installed_version(package: str, extra: str) -> str:
    """The version of the installed `package` (found, not imported), or a `MissingExtraError` as `require`'s."""
    try:
        if importlib.util.find_spec(package) is not None:
            return importlib.metadata.version(package)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        pass
    raise _missing(package, extra)


def _missing(package: str, extra: str) -> MissingExtraError:
    return MissingExtraError(
        f"{package} is not installed; it comes with the {extra} extra: pip install 'vanilla-transformer[{extra}]'",
        name=package,
    )


__all__ = ["MissingExtraError", "installed_version", "require"]
