"""Compiled decoding: transformers' `generate()` with a static cache, every cached decoding step of greedy search,
sampling and beam search run by one `torch.compile`d forward (inductor). Eager decoding stays the default;
`translate_lines(..., compile=True)`, `vanilla-transformer translate --compile` and `benchmarks/generate_speed.py
--compile` use this.

transformers compiles decoding steps by itself only in greedy search and sampling, and by default only on a GPU; its
beam search calls the model eagerly. `compiled_decoding` therefore switches the model's forward, for a `with` block,
to one that sends the cached decoding steps to the compiled forward and the rest to the eager one: the first step
(which allocates the static cache and projects the encoder output into the encoder-decoder attention's cache) and
every call without a static cache. A static cache has one shape for all the steps of a call, so a compiled step is
reused by every step and every later call of the same shapes; callers pad sources to a few lengths
(`bucket_length`) so that a file compiles a handful of steps. Any transformers encoder-decoder whose forward compiles
can be run so (the speed benchmark runs `MarianMTModel` the same way).
"""

import contextlib
import functools
from collections.abc import Iterator

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import EncoderDecoderCache


# Sources are padded to a multiple of this many tokens: one compiled step per 16 tokens of source length.
SOURCE_BUCKET = 16

# Graphs torch keeps per compiled function while `compiled_decoding` runs (its default is 8): a file needs a few per
# decoding setting, and transformers' decorators make the forwards of its models (ours, Marian's) one function.
RECOMPILE_LIMIT = 64

# The `generate()` settings of compiled decoding: a static cache, and transformers' own compilation of greedy steps
# on a GPU off (the model's forward is compiled already).
GENERATE_KWARGS = dict(cache_implementation="static", disable_compile=True)


def bucket_length(length: int, bucket: int = SOURCE_BUCKET) -> int:
    """The padded length of a source of `length` tokens: the next multiple of `bucket`."""
    return -(-length // bucket) * bucket


def default_mode(device: torch.device | str) -> str:
    """inductor's mode: "reduce-overhead" on a GPU (CUDA graphs: a step is one launch), "default" elsewhere. On a CPU,
    "max-autotune-no-cudagraphs" has nothing more to tune: inductor's CPU matrix-product templates need weights
    frozen into the graph (`torch._inductor.config.freezing`), which a static cache rules out (docs/decoding.md)."""
    return "reduce-overhead" if torch.device(device).type == "cuda" else "default"


@functools.cache
def compiled_forward(model_class: type, mode: str):
    """`model_class.forward` compiled once per class and mode (taking the model as first argument), so that its graphs
    are reused by every later block, batch and call. Shapes are static: a new shape compiles a new graph."""
    return torch.compile(model_class.forward, mode=mode, dynamic=False)


def is_decoding_step(cache) -> bool:
    """A step that extends a static cache whose encoder-decoder keys and values are already projected."""
    return isinstance(cache, EncoderDecoderCache) and cache.is_compileable and any(cache.is_updated.values())


@contextlib.contextmanager
def compiled_decoding(model: PreTrainedModel, mode: str | None = None) -> Iterator[PreTrainedModel]:
    """
    Inside the block, `model.generate(**inputs, **GENERATE_KWARGS)` runs its cached decoding steps through the
    compiled forward of `model`'s class (inductor, `mode`, default `default_mode(model.device)`); every other call of
    the model (the first step, steps without a static cache) runs eagerly, as before the block. The first step of each
    shape compiles (seconds to minutes, once per process); up to `RECOMPILE_LIMIT` graphs are kept, and steps of
    further shapes run eagerly, with a warning from torch.

    The model's forward is switched for the duration of the block: other threads calling the model meanwhile get the
    switched forward too.
    """
    compiled = compiled_forward(type(model), mode or default_mode(model.device))
    eager = model.forward

    @functools.wraps(eager)  # generate() reads the forward's signature
    def forward(*args, **kwargs):
        if is_decoding_step(kwargs.get("cache")):
            return compiled(model, *args, **kwargs)
        return eager(*args, **kwargs)

    switched_before = "forward" in vars(model)
    model.forward = forward
    limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    try:
        with torch._dynamo.config.patch(recompile_limit=limit):
            yield model
    finally:
        if switched_before:
            model.forward = eager
        else:
            del model.forward


__all__ = ["GENERATE_KWARGS", "SOURCE_BUCKET", "bucket_length", "compiled_decoding", "default_mode"]
