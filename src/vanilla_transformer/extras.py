"""The package's optional dependencies. Loading a model, `generate()`, `pipeline("translation")` and the translate and
evaluate commands need only the core ones; each other feature imports its packages through `require`, so that a
missing one says which extra installs it: `train` (training, data loading, the number-words corpus, model cards,
the lowercased Moses-tokenized BLEU), `ct2` (the CTranslate2 export and backend), `onnx` (the ONNX export and
backend), `plots` (attention plots) and `demo` (the translation page in the browser: Gradio).
"""

import importlib
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
        raise MissingExtraError(
            f"{package} is not installed; it comes with the {extra} extra: pip install 'vanilla-transformer[{extra}]'",
            name=package,
        ) from None


__all__ = ["MissingExtraError", "require"]
