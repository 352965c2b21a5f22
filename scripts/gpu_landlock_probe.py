"""Which Landlock rules the CUDA stack tolerates: each variant confines a fresh process, then runs a
CUDA tensor op, a Triton kernel and a cuBLAS matmul. Run on the GPU machine (scripts/gpu_check.sh probe).

A variant prints `ok` or the first line of its error; `strace`, when the image has it, lists the
calls the failing full ruleset refused. ``--worker-ruleset``: only the ruleset a GPU worker applies
(``_confine_writes``), exit status 0 when CUDA works under it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

VARIANTS = {
    "full (scratch, /dev)": ("[scratch, '/dev']", None),
    "files only (ABI 3)": ("[scratch, '/dev']", 3),
    "full, writes allowed everywhere": ("['/']", None),
    # H200 image, 2026-11-30: the first two failed with error 304, the third ran, and so did scratch +
    # /dev + /tmp /run /var /proc /sys together. One path at a time narrows it down:
    **{f"full, + {extra}": (f"[scratch, '/dev', '{extra}']", None)
       for extra in ("/tmp", "/run", "/var", "/proc", "/sys")},
    # glibc names another thread by writing /proc/self/task/TID/comm; the driver names its threads.
    "full, + /proc/<own pid>": ("[scratch, '/dev', f'/proc/{os.getpid()}']", None),
}

WORKER_RULESET = """
import os, sys, tempfile
from pathlib import Path
os.environ['KB_GYM_LANDLOCK'] = '1'
from kb_gym.worker.__main__ import _confine_writes
print(_confine_writes(Path(tempfile.mkdtemp()), cpu=False), file=sys.stderr)
"""

VARIANT_RULESET = """
import os, sys, tempfile
from kb_gym.worker.landlock import restrict_writes
scratch = tempfile.mkdtemp()
os.environ['TRITON_CACHE_DIR'] = scratch + '/triton'; os.environ['TMPDIR'] = scratch
print(restrict_writes({paths}, max_abi={abi}), file=sys.stderr)
"""

CUDA_CHECK = """
import torch
x = torch.ones(256, 256, device='cuda')
import triton, triton.language as tl
@triton.jit
def k(p, n: tl.constexpr):
    o = tl.arange(0, n); tl.store(p + o, tl.load(p + o) * 2)
y = torch.ones(1024, device='cuda'); k[(1,)](y, 1024)
assert float(y.sum()) == 2048 and float((x @ x)[0, 0]) == 256
print('ok')
"""


def worker_ruleset_works() -> bool:
    """Whether CUDA, Triton and cuBLAS run under the exact ruleset a GPU worker would apply."""
    code = tempfile.mktemp(suffix=".py")
    with open(code, "w") as fh:
        fh.write(WORKER_RULESET + CUDA_CHECK)
    p = subprocess.run([sys.executable, "-P", code], capture_output=True, text=True, timeout=300)
    ok = (p.stdout.strip().splitlines() or [""])[-1] == "ok"
    print(f"worker ruleset under CUDA: {'ok' if ok else 'FAILS: ' + p.stderr.strip()[-300:]}")
    return ok


def main() -> int:
    if "--worker-ruleset" in sys.argv:  # exit status only: used by gpu_check.sh to pick KB_GYM_LANDLOCK
        return 0 if worker_ruleset_works() else 1
    failing = None
    for name, (paths, abi) in VARIANTS.items():
        code = tempfile.mktemp(suffix=".py")  # a file: Triton reads a kernel's source from it
        with open(code, "w") as fh:
            fh.write(VARIANT_RULESET.format(paths=paths, abi=abi) + CUDA_CHECK)
        p = subprocess.run([sys.executable, "-P", code], capture_output=True, text=True, timeout=300)
        last = (p.stdout.strip().splitlines() or [""])[-1]
        err = [line for line in p.stderr.splitlines() if "Error" in line or "error" in line]
        print(f"{name:<45} {'ok' if last == 'ok' else 'FAILS: ' + (err[-1] if err else p.stderr[-300:])[:200]}")
        if last != "ok" and failing is None:
            failing = code
    if failing and subprocess.run(["which", "strace"], capture_output=True).returncode == 0:
        log = tempfile.mktemp()
        subprocess.run(["strace", "-f", "-o", log, sys.executable, "-P", failing], capture_output=True,
                       timeout=300)
        refused = [line.strip() for line in open(log) if "EACCES" in line or "EPERM" in line]
        print("refused calls (strace):", *refused[:30], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
