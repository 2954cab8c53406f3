"""`cpu_memory.keep_freed_memory`: with glibc's thresholds fixed, memory a step frees is reused by the next step
without page faults; the user's own malloc settings are left alone. Each case runs in a fresh process, since the
setting cannot be undone in the process that makes it."""

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

# Three 12 MiB blocks made and freed together, as a step's activations are: the page faults of each repetition, once
# glibc's thresholds have adjusted to the block size.
CHURN = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from vanilla_transformer.cpu_memory import keep_freed_memory
    print(keep_freed_memory())
else:
    print(None)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    blocks = [torch.ones(3 * 2**20) for _ in range(3)]
    del blocks
start = faults()
for _ in range(10):
    blocks = [torch.ones(3 * 2**20) for _ in range(3)]
    del blocks
print((faults() - start) / 10)
"""
MIB_PAGES = 2**20 // os.sysconf("SC_PAGE_SIZE")


def churn(mode: str, **environment) -> tuple[str, float]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    run = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True,
                         env={**env, **environment})
    applied, faults = run.stdout.split()
    return applied, float(faults)


def test_freed_memory_is_reused_without_page_faults():
    _, default_faults = churn("default")
    applied, kept_faults = churn("keep")
    assert applied == "True"
    assert default_faults >= MIB_PAGES  # glibc as it is hands memory back and takes it again: at least 1 MiB a time
    assert kept_faults <= 0.01 * default_faults


def test_the_users_own_malloc_settings_are_kept():
    applied, faults = churn("keep", MALLOC_TRIM_THRESHOLD_="1000000")
    assert applied == "False"
    assert faults >= MIB_PAGES  # their trim threshold (1 MB) still hands the blocks back
