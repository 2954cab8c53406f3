"""CTranslate2: `export.py` writes a saved model as a CTranslate2 model folder, `search.py` runs one as the `ct2`
backend. Needs the `ct2` extra."""

# Weight types CTranslate2 stores, its `ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES`; named here, where nothing
# is imported, so that the command line lists them without CTranslate2 or torch.
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
# The key of an export's config.json that records its attention for word alignment (`export.py`): the decoder layer
# whose encoder-decoder attention CTranslate2 returns, every head averaged.
EXPORTED_ALIGNMENT = "exported_alignment"
