"""Where a spare's ``digest`` start-up phase goes (0.6 s of its ~1.3 s on an H100: docs/benchmarks.md 1p).

A spare loads the device digest's Triton kernel at start (runner.serve, device_digest.warm) from a Triton cache the
judge seeded, so no compile should be left in it. Each case runs in a fresh interpreter (as a spare forked from the
zygote has torch and Triton imported but no CUDA context) over one Triton cache that a first child filled:

- ``cold``: the first child, filling the cache (the compile);
- ``cached``: the kernel from the filled cache, profiled (cProfile, the top entries by cumulative time);
- ``cached, key first``: the same with Triton's cache key computed before the clock, as the zygote now does before it
  forks (zygote._triton_key).

Run on the device machine: ``python3 -P scripts/digest_warm_profile.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

CHILD = r"""
import cProfile, io, pstats, sys, time
import torch, triton
from kb_gym.worker import device_digest, zygote
torch.zeros(1, device="cuda")  # the spare's context exists before its digest phase (runner.serve's "cuda")
if sys.argv[1] == "key":
    zygote._triton_key()
profile = cProfile.Profile() if sys.argv[2] == "profile" else None
began = time.perf_counter()
if profile:
    profile.enable()
error = device_digest.warm(torch.device("cuda"))
if profile:
    profile.disable()
print(f"warm {time.perf_counter() - began:.3f} s, error {error}")
if profile:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(25)
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])
"""


def main() -> int:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        for name, args in (("cold", ["none", "time"]), ("cached", ["none", "time"]),
                           ("cached, key first", ["key", "time"]), ("cached", ["none", "time"]),
                           ("cached, key first", ["key", "time"]), ("cached, profiled", ["none", "profile"])):
            done = subprocess.run([sys.executable, "-P", "-c", CHILD, *args], env=env, capture_output=True,
                                  text=True, timeout=600)
            print(f"== {name}\n{done.stdout.strip()}\n{done.stderr.strip()[-1500:]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
