"""ONNX: `export.py` writes a saved model as three ONNX graphs, `model.py` runs them with ONNX Runtime behind
`generate()` as the `onnx` backend. Needs the `onnx` extra."""

# The file names of optimum's seq2seq export, which `export.py` writes and `model.py` loads.
ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model.onnx"
DECODER_WITH_PAST_FILE = "decoder_with_past_model.onnx"
ONNX_FILES = (ENCODER_FILE, DECODER_FILE, DECODER_WITH_PAST_FILE)
# Weight types of `--quantize`: int8 is ONNX Runtime's dynamic quantization (int8 weights, activations quantized to
# uint8 on the fly, per tensor, for every matrix product). Named here, where nothing is imported, so that the command
# line lists them without ONNX or torch.
QUANTIZATIONS = ("int8",)
