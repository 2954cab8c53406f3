"""The translation page under load: `--requests` requests sent at once to the page of a model folder served on
loopback (Gradio's queue, one request decoding at a time, as `vanilla-transformer demo` serves it), each of
`--lines` sentences; every answer checked against the backend's translate function called directly on the same
sentences, and the time to answer all of them set beside the time that function takes for the same work one request
after the other (the page's overhead: queue, HTTP, JSON, the alignment pass).

    python benchmarks/page_load.py --model runs/multi30k-en-de/averaged --src test_2016_flickr.en.gz
    python benchmarks/page_load.py --model outputs/number-words-en-fr --requests 40
"""

import argparse
import gzip
import socket
import time

from gradio_client import Client

from vanilla_transformer.backends.table import BACKENDS
from vanilla_transformer.web.page import launch, translation_page
from vanilla_transformer.web.results import Decoding, translate_sentences

NUMBERS = ["forty-two", "one hundred and five", "three thousand and twelve", "nine hundred and ninety-nine thousand"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A saved model folder.")
    parser.add_argument("--src", help="Sentences to send, one a line (.gz: gzip); default: a few number words.")
    parser.add_argument("--requests", type=int, default=20, help="Requests sent at once (default: 20).")
    parser.add_argument("--lines", type=int, default=2, help="Sentences a request (default: 2).")
    args = parser.parse_args()
    opener = gzip.open if (args.src or "").endswith(".gz") else open
    sentences = [line.strip() for line in opener(args.src, "rt", encoding="utf-8")] if args.src else NUMBERS
    texts = ["\n".join(sentences[(k * args.lines + j) % len(sentences)] for j in range(args.lines))
             for k in range(args.requests)]
    translate = BACKENDS["torch"](args.model, "cpu")
    decoding = Decoding(num_beams=4, nbest=4)
    start = time.perf_counter()
    expected = [[result.translation for result in translate_sentences(translate, text, decoding, True)]
                for text in texts]
    direct = time.perf_counter() - start
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    page = translation_page(args.model, translate=translate)
    launch(page, host="127.0.0.1", port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        start = time.perf_counter()
        jobs = [client.submit(text, 4, 4, False, 0, 1.0, 1.0, 0, api_name="/translate") for text in texts]
        answers = [job.result(timeout=600) for job in jobs]
        served = time.perf_counter() - start
    finally:
        page.close()
    right = sum(answer[0].split("\n") == translations for answer, translations in zip(answers, expected))
    print(f"{args.requests} requests at once, {args.lines} sentences each, beam 4, 4-best with alignments, "
          f"one decoding at a time: {right}/{args.requests} answered with translate's translations")
    print(f"  all answered in {served:.2f} s ({served / args.requests:.3f} s a request); the translate function "
          f"alone, one request after the other: {direct:.2f} s; ratio {served / direct:.2f}")


if __name__ == "__main__":
    main()
