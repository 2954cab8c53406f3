"""The translation page of a model, built with Gradio (what Hub Spaces run): `vanilla-transformer demo` serves it, and a
Space's `app.py` (`space.py`) is the same two calls.

```python
>>> from vanilla_transformer.web import launch, translation_page
>>> launch(translation_page("runs/multi30k-en-de/averaged"), port=7860)
```

A person types or pastes sentences, one a line, and sees their translation, the n-best list of a chosen sentence with
its scores, and the alignment of its best translation (the encoder-decoder attention of section 3.2.3, heads
averaged) as a heatmap of source words x target words with its Pharaoh links; the decoding options (beams, n-best,
sampling) are on the page, and the model's facts from its card above them. Translations come from the backend's
`translate` function (`backends.table.BACKENDS`), as in `vanilla-transformer translate`. Requests wait in Gradio's
queue (at most `QUEUE_SIZE`), `CONCURRENCY` of them decoding at a time; input beyond `results.MAX_LINES` lines or `MAX_CHARACTERS`
characters, or a bad choice of options, is one message on the page, never a traceback.
"""

import functools
import os
from collections.abc import Callable
from pathlib import Path

from ..backends.table import BACKENDS
from ..extras import require
from ..inference.hypotheses import TooManyHypothesesError
from .facts import default_beams, model_card, model_facts, model_name
from .results import MAX_BEAMS, MAX_CHARACTERS, MAX_LINES, Decoding, PageInputError, heatmap_html, translate_sentences

# Requests decoding at once (the others wait in the queue, in order), and the most that wait. One: a model in memory
# decodes one batch at a time (PyTorch already spreads a batch over the cores, and the alignment's pass switches the
# model's attention kernel to eager while it runs, which a second thread would see); a queue without bound would grow
# without bound under load.
CONCURRENCY = 1
QUEUE_SIZE = 64
# The heatmap's table.
CSS = """
.heatmap-scroll { overflow-x: auto; }
.alignment-heatmap { border-collapse: collapse; }
.alignment-heatmap th, .alignment-heatmap td { padding: 0.25em 0.45em; text-align: center; border: 1px solid #e5e7eb; }
.alignment-heatmap td.link { outline: 2px solid #f59e0b; outline-offset: -2px; }
.alignment-heatmap caption { caption-side: bottom; font-size: 0.85em; color: #6b7280; padding-top: 0.4em; }
"""
NO_ALIGNMENT = "<p>This backend's model returns no attention to align with (the ONNX export): use torch or ct2.</p>"


def translation_page(model: str | os.PathLike, *, backend: str = "torch", device: str | None = None,
                     translate: Callable[..., list] | None = None):
    """The page (`gradio.Blocks`, queued) of the model `model` (a folder or a Hub id) run by `backend` on `device`,
    or by the `translate` function given (`BACKENDS[backend](model, device)`, loaded by the caller)."""
    gr = require("gradio", extra="demo")
    translate = translate or BACKENDS[backend](model, device)
    alignment = backend != "onnx"
    card = model_card(model)  # read once: for a Hub id, one download
    name = model_name(model, card)
    with gr.Blocks(title=f"{name}: vanilla-transformer", analytics_enabled=False) as page:
        gr.Markdown(f"# {name}\n\nThe Transformer of \"Attention Is All You Need\" (Vaswani et al., 2017), run by "
                    f"`{backend}`.\n\n" + "\n".join(f"- {fact}" for fact in model_facts(model, card)))
        with gr.Row():
            with gr.Column():
                text = gr.Textbox(label="Sentences", lines=4, max_lines=MAX_LINES, elem_id="source",
                                  placeholder="One sentence a line.",
                                  info=f"One sentence a line; at most {MAX_LINES} lines and {MAX_CHARACTERS:,} "
                                  "characters.")
                button = gr.Button("Translate", variant="primary", elem_id="translate")
            translation = gr.Textbox(label="Translation", lines=4, interactive=False, elem_id="translation",
                                     info="One translation a line, the best of each sentence's hypotheses.")
        controls = [text, *_decoding_controls(gr, min(default_beams(model), MAX_BEAMS))]
        results = gr.State([])
        sentence = gr.Dropdown(label="Sentence", choices=[], elem_id="sentence",
                               info="The sentence whose n-best list and alignment are shown.")
        nbest = gr.Dataframe(headers=["rank", "translation", "score", "log P"], label="n-best hypotheses",
                             interactive=False, elem_id="nbest", column_widths=["8%", "68%", "12%", "12%"])
        heatmap = gr.HTML(label="Alignment", elem_id="heatmap")
        links = gr.Textbox(label="Pharaoh links of the best translation", info="source word - target word, from 0",
                           interactive=False, elem_id="links")
        views = [nbest, heatmap, links]
        button.click(functools.partial(_translate, translate, alignment), controls,
                     [translation, results, sentence, *views], api_name="translate")
        sentence.change(functools.partial(_view, alignment), [results, sentence], views, api_name=False)
    return page.queue(max_size=QUEUE_SIZE, default_concurrency_limit=CONCURRENCY)


def _decoding_controls(gr, beams: int) -> list:
    """The decoding options, in the order `_translate` takes them after the text."""
    with gr.Accordion("Decoding", open=True):
        with gr.Row():
            num_beams = gr.Slider(1, MAX_BEAMS, value=beams, step=1, label="Beams", elem_id="beams",
                                  info="Beam search's width (the model's default is its generation config's).")
            nbest = gr.Slider(1, MAX_BEAMS, value=min(4, beams), step=1, label="n-best", elem_id="nbest-size",
                              info="Hypotheses kept per sentence, best first (at most the beams).")
        with gr.Row():
            sampling = gr.Checkbox(label="Sampling", elem_id="sampling",
                                   info="Draw one translation token by token instead (beams and n-best unused).")
            top_k = gr.Slider(0, 100, value=0, step=1, label="top-k", info="0: all tokens.")
            top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="top-p")
            temperature = gr.Slider(0.1, 2.0, value=1.0, step=0.1, label="temperature")
            seed = gr.Number(value=0, precision=0, label="seed")
    return [num_beams, nbest, sampling, top_k, top_p, temperature, seed]


def _translate(translate, alignment: bool, text, num_beams, nbest, sampling, top_k, top_p, temperature, seed):
    """The Translate button: the translations, the results kept for the sentence chooser, and the first sentence's
    n-best list and alignment. Bad input or options are a message on the page (`gradio.Error`)."""
    import gradio as gr

    decoding = Decoding(int(num_beams), int(nbest), bool(sampling), int(top_k), float(top_p), float(temperature),
                        int(seed or 0))
    try:
        found = translate_sentences(translate, text, decoding, alignment)
    except PageInputError as error:
        raise gr.Error(str(error), print_exception=False) from None
    except TooManyHypothesesError as error:
        raise gr.Error(f"n-best {error.nbest} is more than the {error.num_beams} beams: give more beams or a "
                       "smaller n-best.", print_exception=False) from None
    first = next((k for k, result in enumerate(found) if result.source.strip()), 0)
    choices = [(f"{k + 1}. {_shortened(result.source)}", k) for k, result in enumerate(found)]
    return ("\n".join(result.translation for result in found), found, gr.Dropdown(choices=choices, value=first),
            *_view(alignment, found, first))


def _view(alignment: bool, found: list, index) -> tuple:
    """The n-best table, heatmap and links of sentence `index` of the results `found`."""
    if not found or index is None or not 0 <= int(index) < len(found):
        return [], "", ""
    result = found[int(index)]
    matrix = result.alignment()
    if not alignment:
        shown = NO_ALIGNMENT
    else:
        shown = "<p>An empty line has no alignment.</p>" if matrix is None else heatmap_html(*matrix)
    return result.nbest_rows(), shown, result.links()


def _shortened(text: str, length: int = 60) -> str:
    return text if len(text) <= length else text[: length - 1] + "…"


def launch(page, *, host: str | None = None, port: int | None = None, **options):
    """Serve `page` (`translation_page`) on `host`:`port` (default: Gradio's, 127.0.0.1:7860, or its environment
    variables), with the heatmap's style; `options` go to `gradio.Blocks.launch`."""
    return page.launch(server_name=host, server_port=port, css=CSS, show_error=False, **options)


__all__ = ["CONCURRENCY", "QUEUE_SIZE", "launch", "translation_page"]
