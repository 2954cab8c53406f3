"""Memory for training on a CPU: keep what a step frees for the next step.

A training step allocates and frees the same large tensors every time (activations, their gradients, the logits).
glibc's `malloc`, which torch's CPU allocator calls, adjusts two thresholds as the program runs: blocks above the
mmap threshold are mapped from the operating system and unmapped when freed, and free memory at the top of the heap
beyond the trim threshold is handed back. With a step's mix of sizes it keeps handing memory back and taking it again,
and every page taken again is a page fault that the kernel fills with zeros before the step can use it: thousands
per step, all on the step's own time (docs/speed.md measures it). Fixing the two thresholds, as mallopt(3) allows,
stops the adjustment: blocks up to glibc's largest mmap threshold come from the heap, and freed memory stays in the
process, to be reused by the next step. The process then holds about its peak memory until it ends, which a training
run reaches on its first steps anyway.

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
M_MMAP_THRESHOLD = -3
# The largest mmap threshold glibc accepts on 64-bit systems (half its 64 MiB heap size); larger blocks are always
# mapped, and their pages are always taken anew.
LARGEST_MMAP_THRESHOLD = 32 * 1024 * 1024
# Free memory at the top of the heap is handed back only beyond this much: never, in practice, during training.
TRIM_THRESHOLD = 2**31 - 1
# The user's own malloc settings, which take precedence.
MALLOC_ENVIRONMENT = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def keep_freed_memory() -> bool:
    """Fixes glibc malloc's mmap and trim thresholds for this process, so that memory a training step frees is reused
    by the next step instead of being handed back to the operating system and faulted in again. Returns whether it
    did: only under glibc, and not when the user has set malloc's parameters in the environment. It cannot be undone
    in the process (glibc stops adjusting the thresholds for good)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    user_settings = [name for name in MALLOC_ENVIRONMENT if name in os.environ]
    if user_settings or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        logger.info("malloc settings from the environment kept as they are (%s)", ", ".join(user_settings) or
                    "GLIBC_TUNABLES")
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(M_MMAP_THRESHOLD, LARGEST_MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if done:
        logger.info("malloc keeps freed memory for reuse: mmap threshold %d MiB, no trimming",
                    LARGEST_MMAP_THRESHOLD // 2**20)
    return done
