"""What the translation page computes, without Gradio: the sentences typed (bounded), the decoding the page's controls
ask for, and what it shows of each sentence: the translation, its n best hypotheses with their scores, and the
alignment of the best one from the encoder-decoder attention (section 3.2.3) as a heatmap and Pharaoh links.

Every translation goes through the backend's `translate(lines, **options)` (`backends.table.BACKENDS`), the function
`vanilla-transformer translate` runs: the page has no decoding of its own.
"""

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..inference.hypotheses import Hypothesis, pharaoh, strongest_links

# The most the page translates at once: a page shared on the Web (a Space) answers many people on one machine, and the
# command line translates files of any length. The page says these bounds next to its input box.
MAX_LINES = 16
MAX_CHARACTERS = 2000
# The largest beam the page offers, and so the longest n-best list.
MAX_BEAMS = 8


class PageInputError(ValueError):
    """Text the page does not translate: nothing but white space, or more than its bounds."""


def sentences_of(text: str | None) -> list[str]:
    """The lines of `text` to translate, one sentence a line (an empty line gives an empty translation); a
    `PageInputError` for text with no sentence or beyond `MAX_LINES` lines or `MAX_CHARACTERS` characters."""
    lines = (text or "").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise PageInputError("Type or paste a sentence to translate.")
    if len(lines) > MAX_LINES:
        raise PageInputError(f"{len(lines)} lines: the page translates at most {MAX_LINES} at a time (the command "
                             "line, vanilla-transformer translate, takes files of any length).")
    if (characters := sum(len(line) for line in lines)) > MAX_CHARACTERS:
        raise PageInputError(f"{characters:,} characters: the page translates at most {MAX_CHARACTERS:,} at a time "
                             "(the command line, vanilla-transformer translate, takes files of any length).")
    return lines


@dataclass(frozen=True)
class Decoding:
    """The page's decoding controls: beam search with `num_beams` beams, keeping the `nbest` best hypotheses, or
    sampling (one translation a line, token by token, from the `top_k` most likely tokens (0: all), within `top_p`,
    at `temperature`, from `seed`), as `translate --sampling` draws them."""

    num_beams: int = 4
    nbest: int = 1
    sampling: bool = False
    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    seed: int = 0

    def options(self) -> dict:
        """The options of `translate(lines, **options)` for these controls: always n-best hypotheses (at least the
        best one), for their scores."""
        if self.sampling:
            return dict(nbest=1, do_sample=True, num_beams=1, top_k=int(self.top_k), top_p=float(self.top_p),
                        temperature=float(self.temperature), seed=int(self.seed))
        return dict(nbest=int(self.nbest), num_beams=int(self.num_beams))


@dataclass(frozen=True)
class SentenceResult:
    """One line of the input and its hypotheses, best first (one empty hypothesis for an empty line)."""

    source: str
    hypotheses: tuple[Hypothesis, ...]

    @property
    def translation(self) -> str:
        return self.hypotheses[0].text

    def nbest_rows(self) -> list[list]:
        """The n-best table: rank, translation, score (as the search ranks it), log-probability, rounded."""
        return [[rank, hypothesis.text, _rounded(hypothesis.score), _rounded(hypothesis.log_probability)]
                for rank, hypothesis in enumerate(self.hypotheses, start=1)]

    def alignment(self) -> tuple[list[str], list[str], list[list[float]]] | None:
        """The best hypothesis' source words, target words and soft word alignment (`[target word][source word]`),
        None where it has none (an empty line, a backend without attention)."""
        matrix = self.hypotheses[0].alignment
        if not matrix:
            return None
        return (_words(self.source, len(matrix[0])), _words(self.translation, len(matrix)), matrix)

    def links(self) -> str:
        """The best hypothesis' hard alignment as Pharaoh links (source word - target word, from 0)."""
        found = self.alignment()
        return "" if found is None else pharaoh(strongest_links(found[2]))


def translate_sentences(translate: Callable[..., list], text: str, decoding: Decoding,
                        alignment: bool) -> list[SentenceResult]:
    """Each line of `text` (`sentences_of`) with its hypotheses from `translate` under `decoding`, the best one's soft
    alignment with them when the backend gives one (`alignment`)."""
    lines = sentences_of(text)
    options = decoding.options() | (dict(alignment="soft") if alignment else {})
    return [SentenceResult(line, tuple(hypotheses)) for line, hypotheses in zip(lines, translate(lines, **options))]


def heatmap_html(source_words: Sequence[str], target_words: Sequence[str], matrix: Sequence[Sequence[float]]) -> str:
    """A soft alignment as an HTML table: a row a source word, a column a target word, each cell the weight the target
    word gives the source word, shaded by it, the strongest link of each target word outlined."""
    strongest = set(strongest_links(matrix))
    header = "".join(f'<th scope="col">{html.escape(word)}</th>' for word in target_words)
    rows = []
    for s, source_word in enumerate(source_words):
        cells = []
        for t in range(len(target_words)):
            weight = matrix[t][s]
            ink = "#fff" if weight > 0.5 else "#111"
            link = ' class="link"' if (s, t) in strongest else ""
            cells.append(f'<td{link} style="background: rgba(37, 99, 235, {weight:.3f}); color: {ink}" '
                         f'title="{html.escape(source_word)} / {html.escape(target_words[t])}: {weight:.3f}">'
                         f"{weight:.2f}</td>")
        rows.append(f'<tr><th scope="row">{html.escape(source_word)}</th>{"".join(cells)}</tr>')
    return (f'<div class="heatmap-scroll"><table class="alignment-heatmap"><caption>source words (rows) x target words (columns): '
            f"encoder-decoder attention, heads averaged</caption><thead><tr><th></th>{header}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def _words(text: str, count: int) -> list[str]:
    """The `count` whitespace words of `text` that the alignment's pieces were merged into (`inference.alignment`);
    their numbers where a tokenizer split the text otherwise."""
    words = text.split()
    return words if len(words) == count else [str(k) for k in range(count)]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


__all__ = ["Decoding", "MAX_BEAMS", "MAX_CHARACTERS", "MAX_LINES", "PageInputError", "SentenceResult", "heatmap_html",
           "sentences_of", "translate_sentences"]
