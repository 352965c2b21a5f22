"""Where does a timed call lose time against the bare one? One kernel, timed under the disturbances the
pipeline causes (an output copied to the host, host idleness), with each candidate remedy.

Each row: median device time of the call, the implied SM clock from a fixed-cycle spin kernel queued just
before the start event (cycles / its own event time), and the host time of the call.
"""

import os
import time

import torch

from kb_gym.fidelity import CASES, KERNELS
from kb_gym.worker.clock import CacheFlusher, median_ci
from kb_gym.worker.inputs import init_model, make_inputs
from kb_gym.worker.loading import load_module, load_source

dev = torch.device("cuda:0")
PROBE = 200_000  # cycles of the spin right before the start event: its time gives the clock


def call(fn, x, fl, shield=PROBE, pre_gpu_ms=0.0, pre_host_ms=0.0, pre_call=False):
    with torch.no_grad():
        if pre_call:
            fn(*x)
        if pre_gpu_ms:
            torch.cuda._sleep(int(pre_gpu_ms * 2e6))
        fl.flush()
        torch.cuda.synchronize(dev)
        if pre_host_ms:
            end_at = time.perf_counter() + pre_host_ms / 1e3
            while time.perf_counter() < end_at:
                pass
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        torch.cuda._sleep(shield)
        e1.record()
        t0 = time.perf_counter()
        out = fn(*x)
        host = (time.perf_counter() - t0) * 1e3
        e2.record()
        torch.cuda.synchronize(dev)
        spin = e0.elapsed_time(e1)
        return out, e1.elapsed_time(e2), shield / spin / 1e6 if spin > 0 else float("nan"), host


def diagnose(name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    prob = load_source(case.problem.code, "p_" + name)
    cand = init_model(prob, load_module(KERNELS / case.kernel, "k_" + name).ModelNew, 0, dev, torch.float32)
    fl = CacheFlusher(dev)
    for _ in range(3):
        call(cand, make_inputs(prob, 1, dev, torch.float32), fl)

    def row(label, disturb, n=25, **kw):
        ms, ghz, host = [], [], []
        for i in range(n):
            x = make_inputs(prob, 100 + i, dev, torch.float32)
            out, m, g, h = call(cand, x, fl, **kw)
            ms.append(m)
            ghz.append(g)
            host.append(h)
            disturb(out)
            del out, x
        print(f"{name:<28} {label:<34} events {median_ci(ms)[0]:.4f} ms  clock {median_ci(ghz)[0]:.2f} GHz  "
              f"host {median_ci(host)[0]:.4f} ms", flush=True)

    def none(out):
        pass

    def to_host(out):
        out.cpu()

    def idle(out):
        time.sleep(0.05)

    def idle5(out):
        time.sleep(0.005)

    row("back to back", none)
    row("back to back, no shield", none, shield=1)
    row("output to host", to_host)
    row("50 ms idle", idle)
    row("5 ms idle", idle5)
    row("50 ms idle, shield 1 ms", idle, shield=2_000_000)
    row("50 ms idle, GPU spin 2 ms before", idle, pre_gpu_ms=2.0)
    row("50 ms idle, GPU spin 10 ms before", idle, pre_gpu_ms=10.0)
    row("50 ms idle, host spin 2 ms before", idle, pre_host_ms=2.0)
    row("50 ms idle, untimed call before", idle, pre_call=True)
    row("output to host, untimed call before", to_host, pre_call=True)
    row("output to host, GPU spin 2 ms before", to_host, pre_gpu_ms=2.0)


try:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    print("nvml clocks idle: sm", pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
          "mem", pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
          "pstate", pynvml.nvmlDeviceGetPerformanceState(h))
except Exception as exc:  # noqa: BLE001
    print("no nvml:", exc)
os.system("nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,pstate,persistence_mode,"
          "clocks_throttle_reasons.active --format=csv")
for name in os.environ.get("DIAG_CASES", "relu_4096x2048,gelu_scale_8192x16384").split(","):
    diagnose(name)
