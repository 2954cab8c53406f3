"""CTranslate2's beam search run to give `generate()`'s translations: `ct2_translator` loads an `export-ct2` folder
(`export.py`) as the `ct2` backend of `vanilla-transformer translate` and `evaluate`, and `ct2_translate_lines` batches
and decodes as the `torch` backend does, reading the decoding settings as `generate()` reads them. Needs the `ct2`
extra.
"""

import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from ...errors import InputTooLongError, NotExportedError
from ...extras import require
from ...inference.batching import length_sorted_batches
from ...inference.hypotheses import EMPTY, AlignmentUnavailableError, Hypothesis, alignment_layer_of, check_nbest
from ...inference.lines import target_prefix_ids, tokenize_lines
from ...model.decoding_vanilla_transformer import PAPER_DECODING, gnmt_length_penalty, resolve_decoding_settings
from ...paths.model_folders import is_model_folder
from . import EXPORTED_ALIGNMENT
from .outputs import batch_outputs, sampling_options


def ct2_translator(model_dir: str | os.PathLike, device: str | None = None) -> Callable[..., list[str]]:
    """The CTranslate2 folder `model_dir` (from `export.export_ctranslate2`) loaded on `device` ("cpu",
    "cuda", "cuda:1"; default: CUDA when CTranslate2 sees a GPU), as `ct2_translate_lines` bound to its translator,
    tokenizer and generation config."""
    translator, tokenizer = load_translator(model_dir, device)
    model_dir = Path(model_dir)
    if (model_dir / "generation_config.json").is_file():
        generation_config = GenerationConfig.from_pretrained(model_dir)
    else:
        generation_config = GenerationConfig(**PAPER_DECODING)
    return functools.partial(ct2_translate_lines, translator, tokenizer, generation_config=generation_config,
                             exported_alignment=exported_alignment(model_dir))


def exported_alignment(model_dir: Path) -> dict | None:
    """The attention for alignment that the export `model_dir` returns, as `export.py` recorded it in config.json
    (decoder_layer, decoder_layers); None for an export without it (CTranslate2's default returns one head's)."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = config.get(EXPORTED_ALIGNMENT) if isinstance(config, dict) else None
    return found if isinstance(found, dict) and found.get("heads") == "averaged" else None


def load_translator(model_dir: str | os.PathLike, device: str | None = None):
    """The `ctranslate2.Translator` of the CTranslate2 folder `model_dir` on `device` (default: CUDA when CTranslate2
    sees a GPU), and the folder's tokenizer."""
    ctranslate2 = require("ctranslate2", extra="ct2")
    model_dir = Path(model_dir)
    if not ctranslate2.contains_model(str(model_dir)):
        raise NotExportedError(model_dir, "ct2", "CTranslate2 model (model.bin)", is_model_folder(model_dir))
    if device is None:
        device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    device_type, _, index = device.partition(":")
    translator = ctranslate2.Translator(str(model_dir), device=device_type, device_index=int(index or 0))
    return translator, load_tokenizer(model_dir)


# The tokenizer classes a saved folder names for transformers' fast tokenizer (its 5.x and 4.x names), which
# `export-ct2` copies from the model folder.
FAST_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """The folder's tokenizer, as `AutoTokenizer.from_pretrained(model_dir)` loads it. A folder whose
    tokenizer_config.json names the fast tokenizer's class is loaded by that class itself: `AutoTokenizer` would import
    torch (through transformers' configs) to find the class the folder already names. Any other class goes through
    `AutoTokenizer`."""
    try:
        named = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):  # no such file, or not a JSON object: AutoTokenizer says what is wrong
        named = None
    if named in FAST_TOKENIZER_CLASSES:
        return PreTrainedTokenizerFast.from_pretrained(model_dir)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)


# The settings of `generate()` that become CTranslate2's search settings; other options go to `translate_batch`.
DECODING_SETTINGS = (
    "num_beams",
    "length_penalty",
    "length_penalty_type",
    "early_stopping",
    "max_length_over_source",
    "max_new_tokens",
    "max_length",
)


def ct2_translate_lines(
    translator,
    tokenizer: PreTrainedTokenizerBase,
    lines: list[str],
    *,
    batch_size: int = 32,
    max_tokens: int | None = None,
    warn_length: int | None = None,
    show_progress: bool | None = None,
    first_line: int = 1,
    generation_config: GenerationConfig | None = None,
    nbest: int | None = None,
    token_scores: bool = False,
    seed: int | None = None,
    target_prefixes: Sequence[str] | None = None,
    alignment: str | None = None,
    alignment_layer: int | None = None,
    exported_alignment: dict | None = None,
    **options,
) -> list[str] | list[list[Hypothesis]]:
    r"""
    Translate each of `lines` with a `ctranslate2.Translator`, batched as `translate_lines` does for `generate()`
    (sorted by length, `batch_size` sentences and `max_tokens` tokens at most, empty lines give "", long lines reported
    numbered from `first_line`), in input order. `nbest` and `token_scores` give scored hypotheses as `translate_lines`
    does (`outputs.py`); `alignment` aligns them from the attention CTranslate2 returns, the layer the export chose
    (`exported_alignment`, bound by `ct2_translator`; `alignment_layer` must be it). `target_prefixes` start the
    translations (CTranslate2's `target_prefix`; its beam search then stops and ranks as CTranslate2 does).

    The decoding settings of `generate()` are read as it reads them: from `options`, else from `generation_config`
    (the exported model's; section 6.1's when missing):

    - `num_beams` (4 in the paper): CTranslate2's `beam_size`; other `options` go to `Translator.translate_batch`.
    - `do_sample`, `top_k`, `top_p`, `temperature`: CTranslate2's sampling (`sampling_topk`, ...), seeded with `seed`.
    - `length_penalty` (alpha, 0.6) and `length_penalty_type`: CTranslate2's own penalty is transformers' formula,
      finished hypotheses ranked by `log P(Y|X) / |Y|^alpha` (`"transformers"`; `|Y|` counts `</s>`). With `"gnmt"`
      (the paper's) the hypotheses CTranslate2's search finished are re-ranked by `log P(Y|X) / ((5 + |Y|) / 6)^alpha`.
    - `early_stopping`: CTranslate2 stops once `beam_size` hypotheses are finished, as `True` does. With `"never"`
      (the paper's) and `False`, the search goes on as `generate()`'s `"never"` does, until no running hypothesis can
      beat the best finished one (`Ct2Search`). A `patience` option is CTranslate2's own stop instead.
    - `max_new_tokens`: CTranslate2's `max_decoding_length`. Left out, each output ends at the latest after its source
      length + `max_length_over_source` (50) tokens, `</s>` included; as CTranslate2 takes one maximum length per
      call, batches then hold sentences of one length. Where `generate()` ends an output at the limit with `</s>`,
      CTranslate2 stops one token earlier without it: the same text in greedy search, a slightly different score in
      beam search.
    """
    if batch_size < 1 or (max_tokens is not None and max_tokens < 1):
        raise ValueError(f"batch_size ({batch_size}) and max_tokens ({max_tokens}) must be positive")
    settings, search = _decoding(generation_config, options, seed, nbest, tokenizer.eos_token)
    _check_alignment(alignment, nbest, alignment_layer, exported_alignment)
    translations, to_translate, input_ids = tokenize_lines(tokenizer, lines, warn_length, first_line)
    translations = translations if nbest is None else [[EMPTY] for _ in translations]
    if not to_translate:
        return translations
    prefixes = target_prefix_ids(tokenizer, target_prefixes, len(lines), to_translate)
    batches = ct2_batches([len(ids) for ids in input_ids], settings, batch_size, max_tokens, prefixes)
    outputs = functools.partial(batch_outputs, translator, tokenizer, search, nbest=nbest, settings=settings,
                                token_scores=token_scores, alignment=alignment)
    for k, output in _decode(outputs, input_ids, prefixes, batches, show_progress):
        translations[to_translate[k]] = output
    return translations


def _decode(outputs, input_ids, prefixes, batches, show_progress: bool | None):
    """(k, output) for each of `input_ids` (after its target prefix, if any), batch by batch (`ct2_batches`), `outputs`
    giving a batch's outputs; a tqdm bar counts sentences when `show_progress` (default: on a terminal)."""
    show_progress = sys.stderr.isatty() if show_progress is None else show_progress
    with tqdm(total=len(input_ids), unit="sentence", disable=not show_progress) as bar:
        for batch, max_length in batches:
            sources, starts = [input_ids[k] for k in batch], None if prefixes is None else [prefixes[k] for k in batch]
            yield from zip(batch, outputs(sources, starts, max_length))
            bar.update(len(batch))


def _decoding(generation_config: GenerationConfig | None, options: dict, seed, nbest, end_token: str):
    """A call's decoding settings, resolved as `generate()` resolves them (its n-best length checked against its
    beams), and the CTranslate2 search that runs them."""
    defaults = generation_config or GenerationConfig(**PAPER_DECODING)
    options = sampling_options(options, defaults, seed)
    settings = resolve_decoding_settings(None, options, defaults=defaults)
    options = {name: value for name, value in options.items() if name not in DECODING_SETTINGS}
    check_nbest(nbest, settings["num_beams"])
    return settings, ct2_search(settings, options, end_token, nbest or 1)


def _check_alignment(alignment: str | None, nbest: int | None, layer: int | None, exported: dict | None) -> None:
    """An `alignment` the export can give: asked of hypotheses, of the layer it was exported to align with."""
    if alignment is None:
        return
    if exported is None:
        raise AlignmentUnavailableError("CTranslate2", None, layer)
    asked = exported["decoder_layer"] if layer is None else layer  # by default, the exported layer
    if alignment_layer_of(alignment, nbest, asked, exported["decoder_layers"]) != exported["decoder_layer"]:
        raise AlignmentUnavailableError("CTranslate2", exported["decoder_layer"], layer)


def ct2_search(settings: dict, options: dict, end_token: str, nbest: int = 1) -> "Ct2Search":
    """CTranslate2's search for `generate()`'s decoding `settings` (as resolved), with the other `translate_batch`
    `options` as given; `end_token` is the model's `</s>`; `nbest`: how many hypotheses each source needs."""
    num_beams = settings["num_beams"] or 1
    alpha = 1.0 if settings["length_penalty"] is None else settings["length_penalty"]
    gnmt = settings["length_penalty_type"] == "gnmt"
    # Without a length penalty CTranslate2 stops once its best candidate ends, when nothing can beat the best
    # finished hypothesis any more: "never"'s choice.
    staged = num_beams > 1 and alpha != 0 and settings["early_stopping"] is not True and "patience" not in options
    scored = num_beams > 1 and alpha != 0 and (gnmt or staged)
    search = dict(
        beam_size=num_beams,
        length_penalty=alpha,
        num_hypotheses=max(num_beams if scored else 1, nbest),
        return_scores=scored,
        return_end_token=True,  # so |Y| counts </s>, as in generate(); decoding drops it
        min_decoding_length=0,  # generate() may end with </s> at once
        max_input_length=0,  # translate whole sentences, as the PyTorch backend does
    )
    search.update(options)
    return Ct2Search(search, alpha, gnmt and scored, staged, end_token)


# A staged search first decodes to the source length + this many tokens: most translations end by then.
FIRST_STAGE_MARGIN = 5


@dataclass(frozen=True)
class Ct2Search:
    r"""
    CTranslate2's beam search run to give `generate()`'s translation: `options` are `Translator.translate_batch`'s
    arguments but `max_decoding_length`; `alpha` and `gnmt` give the length penalty that ranks finished hypotheses;
    `staged` searches on as `generate()`'s `early_stopping="never"` does; `end_token` is `</s>`.

    CTranslate2 extends and keeps candidates by `log P(Y|X)` as transformers does. It returns its `num_hypotheses`
    best finished hypotheses by `log P(Y|X) / |Y|^beta`, transformers' penalty with `beta = alpha`; with `gnmt` they
    are re-ranked by GNMT's `log P(Y|X) / lp(Y)` (`_ranking_exponent` chooses beta). It stops once
    `round(beam_size * patience)` hypotheses are finished: with `patience` 1, transformers' `early_stopping=True`.
    `generate()`'s "never" (tensor2tensor's "terminate early when possible") stops only once no running hypothesis can
    beat the finished ones even at the longest length. On a trained model the first `beam_size` hypotheses to finish
    are often early endings of the right translation, which finishes after them: CTranslate2's stop keeps the wrong
    ones. It has no stop like "never", so a `staged` search decodes to a length with no stop on the count and checks
    the bound itself (`_settled_best`); sentences it cannot settle are decoded again to twice the length, at most to
    the maximum length, where the whole search has run. The bound is `generate()`'s, so this gives the translation of
    the whole search, as `generate()` does, unless GNMT's best is not among those CTranslate2 returns.
    """

    options: dict
    alpha: float
    gnmt: bool
    staged: bool
    end_token: str

    def best_hypotheses(self, translator, sources: list[list[str]], max_length: int) -> list[list[str]]:
        """The best translation (tokens, with the `</s>` it ended with) of each of `sources` (tokens), of at most
        `max_length` tokens."""
        if not self.options["return_scores"]:  # CTranslate2's ranking stands
            return [result.hypotheses[0] for result in _translate_batch(translator, sources, max_length, self.options)]
        exponent = self._ranking_exponent(max(len(source) for source in sources))
        if not self.staged:
            return [self._best(hypotheses) for hypotheses in self._search(translator, sources, max_length, exponent)]
        best: list[list[str] | None] = [None] * len(sources)
        pending = list(range(len(sources)))
        length = min(max(len(source) for source in sources) + FIRST_STAGE_MARGIN, max_length)
        while pending:
            # At most beam_size hypotheses finish a step: this patience never stops the search before `length`.
            found = self._search(translator, [sources[i] for i in pending], length, exponent, patience=length + 1)
            unsettled = []
            for i, hypotheses in zip(pending, found):
                if length == max_length:  # the whole search has run, hypotheses cut at the limit included
                    best[i] = self._best(hypotheses)
                else:
                    best[i] = self._settled_best(hypotheses, length, max_length, exponent)
                    if best[i] is None:
                        unsettled.append(i)
            pending, length = unsettled, min(2 * length, max_length)
        return best

    def ranked_hypotheses(self, translator, sources: list[list[str]], max_length: int, n: int) -> list[list[list[str]]]:
        """The `n` best translations (tokens, with their `</s>`) of each of `sources`, best first as `generate()` ranks
        them: CTranslate2's own ranking where it stands, else GNMT's or transformers' penalty over the hypotheses of
        the whole search (a staged search settles the best one only)."""
        if n == 1:
            return [[tokens] for tokens in self.best_hypotheses(translator, sources, max_length)]
        if not self.options["return_scores"]:
            return [result.hypotheses[:n] for result in _translate_batch(translator, sources, max_length, self.options)]
        exponent = self._ranking_exponent(max(len(source) for source in sources))
        whole = dict(patience=max_length + 1) if self.staged else {}
        return [
            [tokens for tokens, _ in sorted(found, key=lambda pair: -pair[1] / self._penalty(len(pair[0])))[:n]]
            for found in self._search(translator, sources, max_length, exponent, **whole)
        ]

    def prefixed_hypotheses(self, translator, sources, prefixes, max_length: int, n: int) -> list[list[list[str]]]:
        """The `n` best translations (tokens, the prefix first) of each of `sources` after its target prefix, as
        CTranslate2's search ranks them (`prefixes` of one length)."""
        options = dict(self.options, target_prefix=prefixes, num_hypotheses=max(n, self.options["num_hypotheses"]))
        return [result.hypotheses[:n] for result in _translate_batch(translator, sources, max_length, options)]

    def _ranking_exponent(self, source_length: int) -> float:
        """The `beta` by which CTranslate2 ranks finished hypotheses, `log P(Y|X) / |Y|^beta`, to choose the
        `num_hypotheses` it returns. For transformers' penalty, alpha: its own ranking. GNMT's lp(Y) grows near a
        length n as |Y|^(alpha n / (5 + n)); with n the source length, near which most translations end, CTranslate2
        ranks as GNMT does but between lengths far apart, so that GNMT's best is among those returned (with beta =
        alpha, four longer hypotheses can outrank a short best one)."""
        if not self.gnmt:
            return self.alpha
        return self.alpha * source_length / (5 + source_length)

    def _search(self, translator, sources, max_length: int, exponent: float, **options) -> list[list[tuple]]:
        """The hypotheses CTranslate2 returns for each of `sources`, best first by `log P(Y|X) / |Y|^exponent`, as
        (tokens, log P(Y|X))."""
        options = {**self.options, "length_penalty": exponent, **options}
        return [
            [(tokens, score * len(tokens) ** exponent) for tokens, score in zip(result.hypotheses, result.scores)]
            for result in _translate_batch(translator, sources, max_length, options)
        ]

    def _penalty(self, length: int) -> float:
        """`generate()`'s length penalty of `length` tokens: GNMT's lp(Y), or transformers' |Y|^alpha."""
        return gnmt_length_penalty(length, self.alpha) if self.gnmt else length**self.alpha

    def _best(self, hypotheses: list[tuple]) -> list[str]:
        return max(hypotheses, key=lambda pair: pair[1] / self._penalty(len(pair[0])))[0]

    def _settled_best(self, hypotheses: list[tuple], length: int, max_length: int, exponent: float):
        """The best hypothesis that ended among `hypotheses`, from a search stopped at `length` tokens, short of
        `max_length`, if no hypothesis still running there can beat it by `max_length`; else None."""
        ended = [pair for pair in hypotheses if pair[0][-1:] == [self.end_token]]
        if not ended:
            return None
        tokens, log_prob = max(ended, key=lambda pair: pair[1] / self._penalty(len(pair[0])))
        # The search registered the beam_size best candidates of its last step, all `length` tokens long; the first,
        # returned unless num_hypotheses others outrank it, is at least as likely as every hypothesis still running.
        last_step = [pair[1] for pair in hypotheses if len(pair[0]) == length]
        if last_step:
            running = max(last_step)
        elif len(hypotheses) == self.options["num_hypotheses"]:  # all outrank it, the last returned the least
            running = hypotheses[-1][1] / len(hypotheses[-1][0]) ** exponent * length**exponent
        else:
            return None
        # log P(Y|X) only falls as Y grows, and the penalty is monotone in |Y|: the best score still possible is at
        # the shortest or the longest length to come (generate() ends the longest with </s>: max_length + 1).
        best_possible = max(running / self._penalty(n) for n in (length + 1, max_length + 1))
        return tokens if log_prob / self._penalty(len(tokens)) >= best_possible else None


def ct2_batches(
    lengths: list[int], settings: dict, batch_size: int, max_tokens: int | None, prefixes=None
) -> list[tuple[list[int], int]]:
    """The sources of `lengths` tokens in length-sorted batches, each with its maximum output length as `generate()`'s
    decoding `settings` set it. With target `prefixes` (token ids), a batch holds prefixes of one length, which its
    maximum length counts on top (CTranslate2 counts the prefix, `generate()` does not)."""
    max_length_over_source = settings["max_length_over_source"]
    if max_length_over_source is None:
        # generate()'s own limits: max_length counts the decoder start token; with neither set, 20 new tokens.
        limit = settings["max_new_tokens"] or (settings["max_length"] - 1 if settings["max_length"] else 20)
        batches = [(batch, limit) for batch in length_sorted_batches(lengths, max_tokens, max_sentences=batch_size)]
    else:
        # generate() forces </s> as the last of source + 50 tokens; CTranslate2 stops one token earlier, without it.
        # CTranslate2 takes one maximum output length per call, so a batch holds sentences of one length.
        batches = [
            (batch, max(1, lengths[batch[0]] + max_length_over_source - 1))
            for batch in length_sorted_batches(lengths, max_tokens, max_sentences=batch_size, same_length=True)
        ]
    if prefixes is None:
        return batches
    return [([k for k in batch if len(prefixes[k]) == given], limit + given) for batch, limit in batches
            for given in sorted({len(prefixes[k]) for k in batch})]


def _translate_batch(translator, sources: list[list[str]], max_length: int, search: dict):
    """`translator.translate_batch` of `sources` (tokens), an `InputTooLongError` where they or their outputs outgrow
    the exported position table."""
    try:
        return translator.translate_batch(sources, max_decoding_length=max_length, **search)
    except RuntimeError as error:
        if not _outgrew_positions(error):
            raise
        raise InputTooLongError(f"{error}: the CTranslate2 model has a fixed number of positions") from error


def _outgrew_positions(error: RuntimeError) -> bool:
    """Whether CTranslate2 refused a sequence longer than the model's position table: it says so only in words, the
    one place here that reads them (tests/test_ctranslate2.py checks them against the pinned release)."""
    return "position encodings" in str(error)

__all__ = ["Ct2Search", "ct2_batches", "ct2_search", "ct2_translate_lines", "ct2_translator", "load_translator"]
