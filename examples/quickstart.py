"""Build the paper's base Transformer, save it, reload it through the Auto classes and generate.

    python examples/quickstart.py [--preset base|big|tiny] [--vocab-size 37000]

The weights are freshly initialised, so the output ids are not a translation yet; the point
is the round trip a Hugging Face user relies on: config preset -> model -> save_pretrained -> AutoModelForSeq2SeqLM.
"""

import argparse
import tempfile
import time

import torch
from transformers import AutoModelForSeq2SeqLM

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="base", choices=["base", "big", "tiny"])
    parser.add_argument("--vocab-size", type=int, default=37000)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(args.preset, vocab_size=args.vocab_size)
    model = VanillaTransformerForConditionalGeneration(config)
    print(f"{args.preset}: d_model={config.d_model}, N={config.encoder_layers}, h={config.encoder_attention_heads}, "
          f"d_ff={config.encoder_ffn_dim}, vocab={config.vocab_size}: {model.num_parameters():,} parameters")

    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        reloaded = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
        print(f"saved and reloaded with AutoModelForSeq2SeqLM as {type(reloaded).__name__}")

    source = torch.randint(4, config.vocab_size, (2, 12))
    start = time.perf_counter()
    generated = reloaded.generate(input_ids=source, num_beams=4, max_new_tokens=10)
    print(f"beam-4 generate on 2 sentences: {time.perf_counter() - start:.2f} s, output ids:")
    print(generated.tolist())


if __name__ == "__main__":
    main()
