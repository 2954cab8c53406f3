"""Memory for training on a CPU: keep what a step frees for the next step.

A training step allocates and frees the same large tensors every time (activations, their gradients, the logits).
glibc's `malloc`, which torch's CPU allocator calls, maps blocks above its mmap threshold from the operating system
and unmaps them when they are freed, and hands free memory at the top of its heap back beyond its trim threshold; it
adjusts both thresholds as the program runs, up to 32 MiB for the first. With a step's mix of sizes it keeps handing
memory back and taking it again, and every page taken again is a page fault that the kernel fills with zeros before
the step can use it: thousands per step, tens of thousands when the logits alone are larger than 32 MiB, all on the
step's own time (docs/speed.md measures it). Setting malloc's parameters with mallopt(3) stops this: no block is
mapped on its own, so every block comes from the heap, and the heap is never trimmed, so freed memory stays in the
process for the next step to reuse. The process then holds about its peak memory until it ends, which a training run
reaches on its first steps anyway.

The same effect is what torch's CPU tuning guide gets from preloading jemalloc or TCMalloc; this needs no other
library. A user's own malloc settings (the `MALLOC_*_` environment variables or `glibc.malloc` tunables) are left as
they are.
"""

import ctypes
import logging
import os
import platform

logger = logging.getLogger(__name__)

# mallopt(3) parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
# Free memory at the top of the heap is handed back only beyond this much: never, in practice, during training.
TRIM_THRESHOLD = 2**31 - 1
# The user's own malloc settings, which take precedence.
MALLOC_ENVIRONMENT = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def keep_freed_memory() -> bool:
    """Sets glibc malloc's parameters for this process so that memory a training step frees is reused by the next
    step instead of being handed back to the operating system and faulted in again: no block mapped on its own
    (M_MMAP_MAX 0), no trimming of the heap. Returns whether it did: only under glibc, and not when the user has set
    malloc's parameters in the environment. It cannot be undone in the process (glibc stops adjusting its thresholds
    for good)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    user_settings = [name for name in MALLOC_ENVIRONMENT if name in os.environ]
    if user_settings or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        logger.info("malloc settings from the environment kept as they are (%s)", ", ".join(user_settings) or
                    "GLIBC_TUNABLES")
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if done:
        logger.info("malloc keeps freed memory for reuse: no block mapped on its own, no trimming")
    return done
