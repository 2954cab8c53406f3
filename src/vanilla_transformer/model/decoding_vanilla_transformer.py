"""Section 6.1's decoding rules, apart from any search: the defaults every model saves, the one resolver of decoding
settings and the GNMT length penalty the paper used. `generate()` (`generation_vanilla_transformer.py`) and the
CTranslate2 backend both read them here; standard library only, so that translating with CTranslate2 imports no torch.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import GenerationConfig


# Section 6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ... maximum output length during
# inference to input length + 50, but terminate early when possible". Saved in every model's generation config.
# "Terminate early when possible" is tensor2tensor's rule, transformers' early_stopping="never": stop once no running
# hypothesis can beat the finished ones even at the longest length. early_stopping=True (stop at num_beams finished
# hypotheses) keeps short hypotheses that a confident model finishes early (docs/decoding.md).
PAPER_DECODING = dict(
    num_beams=4,
    length_penalty=0.6,
    length_penalty_type="gnmt",
    early_stopping="never",
    max_length_over_source=50,
)
LENGTH_PENALTY_TYPES = ("gnmt", "transformers")
# The two settings that are the package's, not transformers': taken out of the call before transformers sees it.
PACKAGE_SETTINGS = ("length_penalty_type", "max_length_over_source")


def resolve_decoding_settings(
    generation_config: "GenerationConfig | None",
    call_kwargs: dict | None = None,
    defaults: "GenerationConfig | None" = None,
) -> dict:
    """The decoding settings a call will use, read as `generate()` reads them: the call's keyword arguments, else the
    generation config given to the call (`generation_config`), else `defaults` (the model's generation config).

    Returns `num_beams`, `length_penalty`, `early_stopping`, `max_new_tokens`, `max_length`, `min_new_tokens`,
    `min_length`, `eos_token_id` (None where nothing sets them), `length_penalty_type` (`"transformers"` where nothing
    sets it: transformers' own penalty) and `max_length_over_source`: the source + N limit, None when it is off. It is
    off when set to None in the call, or when the call or its generation config set `max_length` or `max_new_tokens`
    (an explicit length wins).
    """
    call_kwargs = call_kwargs or {}
    sources = [call_kwargs] + [vars(config) for config in (generation_config, defaults) if config is not None]

    def first(name):
        return next((source[name] for source in sources if source.get(name) is not None), None)

    names = ("num_beams", "length_penalty", "early_stopping", "max_new_tokens", "max_length", "min_new_tokens",
             "min_length", "eos_token_id")
    settings = {name: first(name) for name in names}
    settings["length_penalty_type"] = first("length_penalty_type") or "transformers"
    if settings["length_penalty_type"] not in LENGTH_PENALTY_TYPES:
        raise ValueError(
            f"length_penalty_type must be one of {LENGTH_PENALTY_TYPES}, got {settings['length_penalty_type']!r}"
        )
    explicit_length = any(
        source.get(name) is not None
        for source in sources[: 2 if generation_config is not None else 1]
        for name in ("max_length", "max_new_tokens")
    )
    if explicit_length:
        settings["max_length_over_source"] = None
    elif "max_length_over_source" in call_kwargs:  # an explicit None in the call turns the limit off
        settings["max_length_over_source"] = call_kwargs["max_length_over_source"]
    else:
        settings["max_length_over_source"] = first("max_length_over_source")
    return settings


def gnmt_length_penalty(length, alpha: float):
    """GNMT (Wu et al., 2016, eq. 14): lp(Y) = (5 + |Y|)^alpha / (5 + 1)^alpha, for a length or a tensor of lengths."""
    return ((5 + length) / 6) ** alpha
