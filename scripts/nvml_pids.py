"""Can a judge tell, from NVML, which runner's context keeps a GPU busy? (docs/integrity.md, Open: GPU work a paused
neighbour queued before its stop.) Run on the device machine: ``python3 -P scripts/nvml_pids.py``.

A child started as runners are (kb_gym.sandbox.namespace_prefix: its own PID namespace where the host allows one)
spins the GPU for a few seconds. Meanwhile this process reads NVML's compute processes and per-process utilisation
samples, and prints the PIDs NVML names beside the child's PID as this process sees it and the chain of PIDs its
/proc status gives (NSpid). Attribution is possible where NVML's busy PID is one of those; the answer decides whether
the neighbour pause can kill the owner of queued GPU work, or must fall back to measuring again once it is gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

CHILD = r"""
import os, sys, time, torch
x = torch.randn(4096, 4096, device="cuda")
print(os.getpid(), flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20):
        x = (x @ x).tanh_()
    torch.cuda.synchronize()
"""


def _nspid(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(p) for p in line.split()[1:]]
    except OSError:
        pass
    return []


def _descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            kids = []
        found += kids
        frontier += kids
    return found


def main() -> int:
    import pynvml

    from kb_gym.sandbox import namespace_prefix

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    prefix = list(namespace_prefix())
    child = subprocess.Popen([*prefix, sys.executable, "-P", "-c", CHILD, "6"], stdout=subprocess.PIPE, text=True)
    reported = child.stdout.readline().strip() if child.stdout else ""
    time.sleep(2.0)
    since = int(time.time() * 1e6) - 2_000_000
    tree = [child.pid, *_descendants(child.pid)]
    out: dict = {"prefix": prefix, "judge_pid": os.getpid(), "child_pid_here": child.pid,
                 "child_pid_in_its_namespace": reported, "tree_here": tree,
                 "nspid": {str(p): _nspid(p) for p in tree}}
    try:
        out["compute_processes"] = [{"pid": p.pid, "used_bytes": p.usedGpuMemory}
                                    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    except pynvml.NVMLError as exc:
        out["compute_processes"] = f"{type(exc).__name__}: {exc}"
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since)
        out["process_utilisation"] = [{"pid": s.pid, "sm": s.smUtil, "mem": s.memUtil, "t_us": s.timeStamp}
                                      for s in samples]
    except pynvml.NVMLError as exc:
        out["process_utilisation"] = f"{type(exc).__name__}: {exc}"
    child.wait(timeout=30)
    named = {p["pid"] for p in out["compute_processes"]} if isinstance(out["compute_processes"], list) else set()
    busy = {s["pid"] for s in out["process_utilisation"] if s["sm"] > 0} if isinstance(
        out["process_utilisation"], list) else set()
    ours = set(tree) | {p for chain in out["nspid"].values() for p in chain}
    out["attributable"] = bool(busy & ours) or bool(named & ours)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
