"""The translation backends (`table.py`) and the exports they run (`ctranslate2/`, `onnx/`)."""


class UnsupportedModelError(ValueError):
    """A model that an export's backend cannot run as it was trained: the message names the config fields and values
    that rule it out (the command line prints it as one line)."""


class ExportSettingsError(ValueError):
    """Export settings that cannot be honoured, found before anything is loaded: an unknown quantization, an empty
    position table, an output folder that would replace the model's."""
