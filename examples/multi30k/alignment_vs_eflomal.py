"""How well the word alignment read off the encoder-decoder attention (`translate --alignment hard`) agrees with an
independent statistical aligner, eflomal (Östling and Tiedemann, 2016; `pip install eflomal`), for each decoder layer.

    python examples/multi30k/alignment_vs_eflomal.py --model runs/multi30k-tiny/averaged \\
        --data-dir path/to/multi30k --out alignment.md

The model translates test_2016_flickr; eflomal aligns those (source, translation) pairs, learning its model on them
together with the Multi30k training pairs; its forward and reverse links, symmetrised by grow-diag-final-and as Moses
and fast_align do, are the reference. Each layer's links (every target word to the source word it attends to most,
heads averaged) are scored against them: precision, recall and AER (Och and Ney, 2003, with the reference as both sure
and possible links: 1 - F1). Words are the whitespace words of the text as it is, as `--alignment` numbers them;
eflomal sees them lowercased.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from vanilla_transformer.inference.alignment import align
from vanilla_transformer.inference.hypotheses import alignment_layer_of
from vanilla_transformer.inference.scoring import teacher_forced_pass
from vanilla_transformer.inference.translate import translate_lines
from vanilla_transformer.paths import text_files


def read_links(path: Path) -> list[set[tuple[int, int]]]:
    """Pharaoh links, one sentence a line, as sets of (source word, target word)."""
    return [{tuple(map(int, link.split("-"))) for link in line.split()} for line in
            path.read_text(encoding="utf-8").splitlines()]


def grow_diag_final_and(forward: set, reverse: set) -> set:
    """Koehn et al.'s (2003) symmetrisation of two directional alignments (Moses' grow-diag-final-and): from their
    intersection, add union links next to (diagonals included) an aligned one whose source or target word is still
    unaligned, then union links both of whose words are unaligned."""
    union, links = forward | reverse, forward & reverse
    neighbours = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]
    grew = True
    while grew:
        grew = False
        for source, target in sorted(links):
            for ds, dt in neighbours:
                link = (source + ds, target + dt)
                if link in union and link not in links and (
                        all(s != link[0] for s, _ in links) or all(t != link[1] for _, t in links)):
                    links.add(link)
                    grew = True
    for directional in (forward, reverse):
        for link in sorted(directional):
            if all(s != link[0] for s, _ in links) and all(t != link[1] for _, t in links):
                links.add(link)
    return links


def agreement(ours: list[set], reference: list[set]) -> dict:
    """Precision, recall and AER of `ours` against `reference` over a corpus (sure = possible = reference)."""
    found = sum(len(a & r) for a, r in zip(ours, reference))
    ours_count, reference_count = sum(map(len, ours)), sum(map(len, reference))
    return dict(precision=found / ours_count, recall=found / reference_count,
                aer=1 - 2 * found / (ours_count + reference_count), links=ours_count)


def eflomal_links(sources: list[str], targets: list[str], train: tuple[list[str], list[str]]) -> list[set]:
    """eflomal's grow-diag-final-and links of each (source, target) pair, aligned together with the `train` pairs."""
    import eflomal

    def words(lines):  # lowercased; an empty line gets a placeholder, its links then dropped
        return [line.lower() if line.split() else "<empty>" for line in lines]

    with tempfile.TemporaryDirectory() as folder:
        forward, reverse = Path(folder) / "forward", Path(folder) / "reverse"
        eflomal.Aligner().align(words(sources + train[0]), words(targets + train[1]),
                                links_filename_fwd=str(forward), links_filename_rev=str(reverse))
        pairs = zip(read_links(forward)[: len(sources)], read_links(reverse)[: len(sources)])
        return [grow_diag_final_and(f, r) if target.split() else set()
                for (f, r), target in zip(pairs, targets)]


def layer_links(model, tokenizer, sources: list[str], found: list, layer: int, batch_size: int = 64) -> list[set]:
    """The hard links of each hypothesis in `found` (one a source) from decoder layer `layer`'s attention."""
    links = []
    for start in range(0, len(sources), batch_size):
        batch = [(tokenizer(source)["input_ids"], tokenizer.convert_tokens_to_ids(list(hypothesis.tokens)))
                 for source, hypothesis in zip(sources[start: start + batch_size], found[start: start + batch_size])
                 if hypothesis.tokens]
        source_ids, target_ids = [pair[0] for pair in batch], [pair[1] for pair in batch]
        _, weights = teacher_forced_pass(model, source_ids, target_ids, attention_layer=layer)
        aligned = iter(align(tokenizer, source_ids, target_ids, weights, "hard"))
        links += [set(next(aligned)) if hypothesis.tokens else set() for hypothesis in found[start: start + batch_size]]
    return links


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="An English -> German model folder.")
    parser.add_argument("--data-dir", type=Path, required=True, help="The Multi30k folder.")
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="de")
    parser.add_argument("--out", type=Path, help="Also write the table here.")
    args = parser.parse_args(argv)
    source, target = args.source_lang, args.target_lang
    sources = text_files.read_lines(args.data_dir / f"test_2016_flickr.{source}.gz")
    train = tuple(text_files.read_lines(args.data_dir / f"train.{lang}.gz") for lang in (source, target))
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(args.model), AutoTokenizer.from_pretrained(args.model)
    # One decoding, aligned with the default layer as `translate --alignment hard` aligns; every layer's links from
    # the same functions on its hypotheses (the teacher-forced pass, its heads averaged, merged into words).
    found = [best for best, *_ in translate_lines(model, tokenizer, sources, batch_size=64, nbest=1, token_scores=True,
                                                  alignment="hard")]
    translations = [hypothesis.text for hypothesis in found]
    reference = eflomal_links(sources, translations, train)
    rows = []
    for layer in range(model.config.decoder_layers):
        links = layer_links(model, tokenizer, sources, found, layer)
        if layer == alignment_layer_of("hard", 1, None, model.config.decoder_layers):
            assert links == [set(hypothesis.alignment or []) for hypothesis in found]
        rows.append(dict(layer=layer, **agreement(links, reference)))
        print(f"layer {layer}: AER {rows[-1]['aer']:.3f}", file=sys.stderr, flush=True)
    table = ["| decoder layer | precision | recall | AER | links |", "| --- | --- | --- | --- | --- |"]
    table += [f"| {row['layer']}{' (last)' if row['layer'] == len(rows) - 1 else ''} | {row['precision']:.3f} | "
              f"{row['recall']:.3f} | {row['aer']:.3f} | {row['links']:,} |" for row in rows]
    table.append(f"\neflomal's links (grow-diag-final-and): {sum(map(len, reference)):,}, over {len(sources):,} "
                 f"sentences; the best layer by AER: {min(rows, key=lambda row: row['aer'])['layer']}.")
    text = "\n".join(table) + "\n"
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main(sys.argv[1:])
