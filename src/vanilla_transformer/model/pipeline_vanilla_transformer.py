"""`pipeline("translation")` and `pipeline("text2text-generation")` for sequence-to-sequence models.

transformers 5 removed these two tasks (and `translation_xx_to_yy`). This file brings them back for translation
models through `PIPELINE_REGISTRY.register_pipeline`: importing `vanilla_transformer` registers them, and
`pipeline("translation_en_to_de", model=DIR)` registers the language pair it names as it looks the task up; the
pipeline then checks the pair against its model's config. A saved model folder lists the same tasks in its config's
`custom_pipelines`, so `pipeline("translation", model=DIR, trust_remote_code=True)` also works where the package is
not installed. It imports only transformers, as remote code must.
"""

import re

from transformers import Pipeline


class Text2TextGenerationPipeline(Pipeline):
    """Text in, generated text out: `[{"generated_text": ...}]` per input, decoded with the model's generation
    config (for vanilla-transformer, section 6.1's beam search) unless the call passes generation arguments."""

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    return_name = "generated"

    def _sanitize_parameters(self, return_tensors=None, clean_up_tokenization_spaces=None, truncation=None, **kwargs):
        # Translation pipelines of transformers 4 took the language pair as arguments; the model here knows it.
        kwargs.pop("src_lang", None)
        kwargs.pop("tgt_lang", None)
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        postprocess_params = {}
        if return_tensors is not None:
            postprocess_params["return_tensors"] = return_tensors
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        # The rest are generation arguments, `pipeline(...)`'s under the call's: `Pipeline` merges them as forward
        # parameters, and `_forward` hands them to `generate()`.
        return preprocess_params, kwargs, postprocess_params

    def __call__(self, inputs, **kwargs):
        """`inputs`: a string, a list of strings, or a dataset/generator of strings (e.g. `KeyDataset`)."""
        results = super().__call__(inputs, **kwargs)
        # One output per input unless num_return_sequences asks for more, as transformers 4's pipelines did.
        if isinstance(inputs, list) and all(len(result) == 1 for result in results):
            return [result[0] for result in results]
        return results

    def preprocess(self, text, truncation=False):
        if not isinstance(text, str):
            raise TypeError(f"{self.return_name} pipeline: expected a string, got {type(text).__name__}")
        return self.tokenizer(text, truncation=truncation, return_tensors="pt")

    def _forward(self, model_inputs, **generate_kwargs):
        sequences = self.model.generate(**model_inputs, **generate_kwargs)
        batch_size = model_inputs["input_ids"].shape[0]
        return {"output_ids": sequences.reshape(batch_size, sequences.shape[0] // batch_size, -1)}

    def postprocess(self, model_outputs, return_tensors=False, clean_up_tokenization_spaces=False):
        key = f"{self.return_name}_token_ids" if return_tensors else f"{self.return_name}_text"
        return [
            {
                key: output_ids
                if return_tensors
                else self.tokenizer.decode(
                    output_ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            }
            for output_ids in model_outputs["output_ids"][0]
        ]


class TranslationPipeline(Text2TextGenerationPipeline):
    """`pipeline("translation", model=DIR)` and `pipeline("translation_en_to_de", model=DIR)`: text in,
    `[{"translation_text": ...}]` out. The model translates in the direction it was trained for; a task naming another
    pair than its config's `source_lang` / `target_lang` is refused in one line that names the model's pair."""

    return_name = "translation"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        asked = language_pair(self.task)
        trained = (getattr(self.model.config, "source_lang", None), getattr(self.model.config, "target_lang", None))
        if asked and not all(trained):  # as transformers says of a task it does not know
            raise KeyError(wrong_pair_message(self.task, trained))
        if asked and asked != trained:
            raise ValueError(wrong_pair_message(self.task, trained))


# The tasks, as `PIPELINE_REGISTRY` and config.json's `custom_pipelines` name them.
PIPELINE_TASKS = {"translation": TranslationPipeline, "text2text-generation": Text2TextGenerationPipeline}


def language_pair_task(source_lang: str | None, target_lang: str | None) -> str | None:
    """`translation_en_to_de` for a model that translates English to German (transformers 4's task names)."""
    return f"translation_{source_lang}_to_{target_lang}" if source_lang and target_lang else None


def language_pair(task: str | None) -> tuple[str, str] | None:
    """("en", "de") for the task `translation_en_to_de`; None for any other task."""
    match = re.fullmatch(r"translation_(.+?)_to_(.+)", task or "")
    return match.groups() if match else None


def wrong_pair_message(task: str, trained: tuple[str | None, str | None] | None) -> str:
    """One line for a `translation_xx_to_yy` task the model does not translate, naming the pair it does."""
    if trained and all(trained):
        (asked_source, asked_target), (source, target) = language_pair(task), trained
        return (f"Task {task} asks for {asked_source} -> {asked_target}, but the model translates {source} -> "
                f"{target}: use pipeline(\"translation\") or pipeline(\"{language_pair_task(source, target)}\")")
    return (f"Unknown task {task}: the model's config names no language pair (source_lang, target_lang); "
            "use pipeline(\"translation\"), which translates as the model was trained")


def _check_task_registering_language_pairs(check_task):
    """`PIPELINE_REGISTRY.check_task`, which registers a `translation_xx_to_yy` task it does not know yet for
    `TranslationPipeline`: the pipeline, made with its model, says whether the model translates that pair."""

    def check(task: str):
        try:
            return check_task(task)
        except KeyError:
            if language_pair(task) is None:
                raise
            register(task, TranslationPipeline)
            return check_task(task)

    check.registers_language_pairs = True
    return check


def register_pipelines():
    """Make `pipeline("translation" | "text2text-generation")` available again in this process (done by
    `import vanilla_transformer`); `translation_xx_to_yy` is registered when a pipeline is made for it."""
    from transformers.pipelines import REMOVED_TASKS

    for task, pipeline_class in PIPELINE_TASKS.items():
        # `pipeline()` refuses the tasks transformers 5 removed by name, before it consults the registry: whatever is
        # registered for them, they must leave that list (docs/internals.md).
        REMOVED_TASKS.pop(task, None)
        register(task, pipeline_class)
    from transformers.pipelines import PIPELINE_REGISTRY

    if not getattr(PIPELINE_REGISTRY.check_task, "registers_language_pairs", False):
        PIPELINE_REGISTRY.check_task = _check_task_registering_language_pairs(PIPELINE_REGISTRY.check_task)


def register(task: str, pipeline_class: type):
    from transformers import AutoModelForSeq2SeqLM
    from transformers.pipelines import PIPELINE_REGISTRY

    if not registered(task, pipeline_class):  # registering anew would warn that it overwrites
        PIPELINE_REGISTRY.register_pipeline(
            task, pipeline_class=pipeline_class, pt_model=AutoModelForSeq2SeqLM, type="text"
        )


def registered(task: str = "translation", pipeline_class: type = TranslationPipeline) -> bool:
    """Whether `pipeline_class` is registered for `task`; False, without importing them, before transformers'
    pipelines are imported."""
    import sys

    registry = getattr(sys.modules.get("transformers.pipelines"), "PIPELINE_REGISTRY", None)
    if registry is None:
        return False
    # The registry's table, not its `check_task`, which registers the language pair it is asked about.
    return registry.supported_tasks.get(task, {}).get("impl") is pipeline_class
