"""Where does a runner's timed call lose time against the bare one? One kernel, timed several ways."""

import tempfile
import time
from pathlib import Path

import torch

from kb_gym.fidelity import CASES, KERNELS
from kb_gym.worker.clock import CacheFlusher, median_ci, timed_call
from kb_gym.worker.inputs import init_model, make_inputs
from kb_gym.worker.loading import load_module
from kb_gym.worker.runner_pool import RunnerPool
from kb_gym.worker.tensors import host_bytes

dev = torch.device("cuda:0")
def diagnose(name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    folder = Path(tempfile.mkdtemp())
    (folder / "p.py").write_text(case.problem.code)
    prob = load_module(folder / "p.py", "p_" + name)
    cand = init_model(prob, load_module(KERNELS / case.kernel, "k_" + name).ModelNew, 0, dev, torch.float32)
    fl = CacheFlusher(dev)
    x = make_inputs(prob, 1, dev, torch.float32)

    def med(fn, n=30):
        return median_ci([fn(i) for i in range(n)])[0]

    for _ in range(3):
        timed_call(cand, x, dev, fl)
    rows = {"same inputs": med(lambda i: timed_call(cand, x, dev, fl)[1])}
    rows["fresh inputs"] = med(lambda i: timed_call(cand, make_inputs(prob, 100 + i, dev, torch.float32), dev, fl)[1])

    def with_d2h(i):
        out, ms, _ = timed_call(cand, make_inputs(prob, 200 + i, dev, torch.float32), dev, fl)
        host_bytes(out)
        return ms
    rows["fresh + output to host"] = med(with_d2h)

    def idle(i):
        time.sleep(0.05)
        return timed_call(cand, make_inputs(prob, 300 + i, dev, torch.float32), dev, fl)[1]
    rows["fresh + 50 ms idle"] = med(idle)
    pool = RunnerPool("cuda:0", Path(tempfile.mkdtemp()))
    runner = pool.take()
    runner.prepare(case.problem.code, 0, "fp32", False, 60)
    runner.load((KERNELS / case.kernel).read_text(), 0, 120)
    for i in range(3):
        runner.call(400 + i, timeout=60, byte_limit=1 << 40, timed=True)
    replies = [runner.call(500 + i, timeout=60, byte_limit=1 << 40, timed=True) for i in range(20)]
    rows["runner events"] = median_ci([r.event_ms for r in replies])[0]
    rows["runner envelope"] = median_ci([r.envelope_ms for r in replies])[0]
    pool.pristine(30)
    replies = [runner.call(600 + i, timeout=60, byte_limit=1 << 40, timed=True) for i in range(20)]
    rows["runner events, spare settled"] = median_ci([r.event_ms for r in replies])[0]
    runner.kill()
    pool.close()
    print(name, " | ".join(f"{k} {v:.4f}" for k, v in rows.items()), flush=True)


for name in ("relu_4096x2048", "softsign_8192x65536_triton"):
    diagnose(name)
