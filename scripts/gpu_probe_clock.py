"""Can a pristine process see another process's GPU time? The experiment behind docs/integrity.md's clock design for
round 4's open hole (a runner's reported event time is believed within the envelope's tolerance).

Without MPS, kernels of two CUDA contexts never run at once: the GPU time-slices between contexts that both have work.
A probe process keeps one small kernel spinning that reads ``%globaltimer`` and records every gap between two readings
over ``--gap-us``: time its context was off the GPU. A worker process (standing in for a runner) runs workloads of
known length (``torch.cuda._sleep`` spins and matmuls) between two kernels that stamp ``%globaltimer`` (in the
experiment only: a real runner's stamps could not be trusted). Per call the script prints the worker's bracketed GPU
time, the sum of the probe's gaps inside the bracket, their count, and the worker's CUDA-event time with and without
the probe running (what the probe costs the candidate's own clock).

    python3 -P scripts/gpu_probe_clock.py            # on the device machine (scripts/gpu_check.sh clock)

What would make the design work: gaps within a few microseconds of the bracketed time for 5 us-15 ms workloads, no
gap where the worker is idle, and event times with the probe near those without it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.multiprocessing as mp

CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
__global__ void probe_kernel(unsigned long long* gaps, int max_gaps, volatile int* stop,
                             unsigned long long threshold, int* count) {
  unsigned long long last = now_ns();
  int n = 0;
  while (!*stop) {
    unsigned long long t = now_ns();
    if (t - last > threshold && n < max_gaps) { gaps[2 * n] = last; gaps[2 * n + 1] = t; n++; }
    last = t;
  }
  *count = n;
}
__global__ void stamp_kernel(unsigned long long* out) { *out = now_ns(); }
void probe(torch::Tensor gaps, torch::Tensor stop, int64_t threshold, torch::Tensor count) {
  probe_kernel<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(
      (unsigned long long*)gaps.data_ptr<int64_t>(), (int)(gaps.numel() / 2), stop.data_ptr<int>(),
      (unsigned long long)threshold, count.data_ptr<int>());
}
void stamp(torch::Tensor out) {
  stamp_kernel<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>((unsigned long long*)out.data_ptr<int64_t>());
}
"""
CPP = "void probe(torch::Tensor, torch::Tensor, int64_t, torch::Tensor); void stamp(torch::Tensor);"


def _ext():
    from torch.utils.cpp_extension import load_inline

    return load_inline("kb_probe_clock", CPP, cuda_sources=CUDA, functions=["probe", "stamp"], verbose=False,
                       extra_cuda_cflags=["-O2"])


def probe_process(ready, done, result, gap_us: float, max_gaps: int) -> None:
    ext = _ext()
    gaps = torch.zeros(2 * max_gaps, dtype=torch.int64, device="cuda")
    stop = torch.zeros(1, dtype=torch.int32, device="cuda")
    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ext.probe(gaps, stop, int(gap_us * 1e3), count)
    ready.set()
    done.wait()
    stop.fill_(1)  # the default stream: runs beside the spinning probe in this context
    torch.cuda.synchronize()
    n = int(count.item())
    result.put(gaps[: 2 * n].view(n, 2).cpu().tolist())


def workloads() -> list[tuple[str, object]]:
    a = torch.randn(4096, 4096, device="cuda")
    # kHz -> cycles per us (the H200's 1.98 GHz where torch does not say)
    cycles_per_us = getattr(torch.cuda.get_device_properties(0), "clock_rate", 1_980_000) / 1e3
    out = [(f"sleep {us} us", (lambda c=int(us * cycles_per_us): torch.cuda._sleep(c)))
           for us in (5, 20, 100, 300, 1000, 5000, 15000)]
    out.append(("matmul 4096", lambda: a @ a))
    return out


def worker(reps: int, ext) -> list[dict]:
    stamps = torch.zeros(2, dtype=torch.int64, device="cuda")
    rows = []
    for name, fn in workloads():
        fn()
        torch.cuda.synchronize()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ext.stamp(stamps[0:1])
            start.record()
            fn()
            end.record()
            ext.stamp(stamps[1:2])
            torch.cuda.synchronize()
            t0, t1 = stamps.tolist()
            rows.append({"workload": name, "event_ms": start.elapsed_time(end), "bracket": [t0, t1]})
            time.sleep(0.002)  # idle between calls: the probe should see no gap here
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--gap-us", type=float, default=2.0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    ext = _ext()
    alone = worker(args.reps, ext)
    ctx = mp.get_context("spawn")
    ready, done, result = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=probe_process, args=(ready, done, result, args.gap_us, 1 << 20))
    proc.start()
    if not ready.wait(300):
        raise SystemExit("the probe did not start")
    time.sleep(0.5)
    beside = worker(args.reps, ext)
    done.set()
    gaps = result.get(timeout=120)
    proc.join(60)
    table = {}
    for row in beside:
        t0, t1 = row["bracket"]
        inside = [(max(a, t0), min(b, t1)) for a, b in gaps if b > t0 and a < t1]
        row["gap_ms"] = sum(b - a for a, b in inside) / 1e6
        row["gaps"] = len(inside)
        row["bracket_ms"] = (t1 - t0) / 1e6
    idle = sum(1 for a, b in gaps if not any(r["bracket"][0] <= b and a <= r["bracket"][1] for r in beside))
    print(f"{'workload':>14} {'event alone':>12} {'event beside':>13} {'bracket':>9} {'gaps sum':>9} {'gaps':>5}")
    for name, _ in workloads():
        a = [r["event_ms"] for r in alone if r["workload"] == name]
        b = [r for r in beside if r["workload"] == name]
        table[name] = {"event_alone_ms": statistics.median(a),
                       "event_beside_ms": statistics.median(r["event_ms"] for r in b),
                       "bracket_ms": statistics.median(r["bracket_ms"] for r in b),
                       "gap_ms": statistics.median(r["gap_ms"] for r in b),
                       "gaps": statistics.median(r["gaps"] for r in b)}
        t = table[name]
        print(f"{name:>14} {t['event_alone_ms']:12.4f} {t['event_beside_ms']:13.4f} {t['bracket_ms']:9.4f} "
              f"{t['gap_ms']:9.4f} {t['gaps']:5.0f}")
    print(f"gaps outside any call (the worker idle): {idle} of {len(gaps)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"table": table, "idle_gaps": idle, "gaps": len(gaps), "gap_us": args.gap_us}, f, indent=1)


if __name__ == "__main__":
    main()
