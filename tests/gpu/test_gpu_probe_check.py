"""The probe clock on a real GPU (kb_gym/worker/probe_clock.py, probe_check.py): round 4's time lie against it.

Run on the device machine by scripts/gpu_check.sh; skipped elsewhere (tests/conftest.py).
"""

from __future__ import annotations

import time

import pytest
import torch

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.problems import reference_as_candidate
from kb_gym.worker.probe_check import MAX_CLAIM_MS
from kb_gym.worker.probe_clock import ProbeClock, busy_in

pytestmark = pytest.mark.gpu

# integrity "off": the liar reaches the runner's module table without a static check standing in its way; what is
# tested is the clock, not the checks in front of it
CONFIG = EvalConfig(trials=3, timing_min_reps=5, timing_max_reps=20, timing_warmup=2, integrity="off", probe_check=True)

RELU = Problem(id=19, name="19_ReLU_probe", level=1, code='''import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(4096, 4096)]
def get_init_inputs():
    return []
''')

TRITON_RELU = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 4096),)](x, out, n, BLOCK=4096)
        return out
'''

# Round 4's lie: the runner's timed_call rewritten to report 1 us; the forward is the honest Triton ReLU, run three
# times over (a slow kernel that claims to be fast)
LIAR = TRITON_RELU.replace("        return out", """        relu_kernel[(triton.cdiv(n, 4096),)](x, out, n, BLOCK=4096)
        relu_kernel[(triton.cdiv(n, 4096),)](x, out, n, BLOCK=4096)
        return out""") + '''
import sys as _sys
_runner = _sys.modules["kb_gym.worker.runner"]
_real = _runner.timed_call


def _one_microsecond(*a, **k):
    return _real(*a, **k)._replace(ms=1e-3, host_ms=1e-3)


_runner.timed_call = _one_microsecond
'''


@pytest.fixture(scope="module")
def ev():
    with Evaluator("cuda:0", results_path=False, baseline_cache=False) as e:
        yield e


def test_the_probe_sees_another_processs_kernel(tmp_path):
    # A matmul's GPU time (its events, alone) against what the probe, another process, saw of it: a kernel that
    # sleeps on the SM clock would not do (preempted, it sleeps on without the GPU: session 28's 5 ms sleeps)
    a = torch.randn(2048, 2048, device="cuda")
    alone = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ a
        end.record()
        torch.cuda.synchronize()
        alone.append(start.elapsed_time(end))
    probe = ProbeClock("cuda:0", tmp_path / "probe.log")
    try:
        assert probe.wait_ready(), probe.note
        seen = []
        with probe.spinning():
            for _ in range(5):
                t0 = probe.mark()
                a @ a
                torch.cuda.synchronize()
                t1 = probe.mark()
                time.sleep(0.002)
                t2 = probe.mark()
                seen.append((t0, t1, t2))
            gaps = probe.stop()
        busy = sorted(busy_in(gaps, t0, t1)[0] for t0, t1, _ in seen)[2]
        idle = max(busy_in(gaps, t1, t2)[0] for _, t1, t2 in seen)
        want = sorted(alone)[2]
        # never less than the kernel's own GPU time; more by what the context holds the GPU for idle (H200: a 0.365
        # ms matmul read 0.64 ms, docs/benchmarks.md 0w)
        assert 0.9 * want < busy < 2.5 * want + 0.5, (busy, want, gaps[:6])
        assert idle < 0.02, (idle, gaps[:6])
    finally:
        probe.close()


def test_an_honest_kernel_is_not_charged(ev):
    for k, source in enumerate((reference_as_candidate(RELU), TRITON_RELU)):
        r = ev.evaluate(RELU, source, config=CONFIG)
        assert r.status == "correct", (r.status, r.error)
        probe = r.correctness["envelope"]["probe"]
        assert probe and "calls" in probe, probe  # it ran: the ReLU is far under a time slice
        assert not probe["counted"] and "side_stream" not in r.flags, (probe, r.flags)
        assert r.runtime_ms < MAX_CLAIM_MS
        if k == 0:  # the problem's first pass, read again once the candidate's tree was gone (probe_check.settle)
            assert probe["after_exit_share_ms"] is not None, probe
            assert r.stage_seconds.get("probe_after_exit", 0) > 0, r.stage_seconds


def test_a_false_event_time_is_charged_what_the_probe_saw(ev):
    r = ev.evaluate(RELU, LIAR, config=CONFIG)
    assert r.status == "correct", (r.status, r.error)
    probe = r.correctness["envelope"]["probe"]
    assert probe["counted"] and "side_stream" in r.flags, (probe, r.flags)
    assert probe["forward_ms"] > 0.02 and r.runtime_ms >= probe["forward_ms"] * 0.9, (probe, r.runtime_ms)
    assert probe["after_exit_share_ms"] is not None, probe  # a charge is read again once its tree is gone
    honest = ev.evaluate(RELU, TRITON_RELU, config=CONFIG)  # the next honest evaluation is judged as on a fresh one
    assert honest.status == "correct", (honest.status, honest.error)
    assert not honest.correctness["envelope"]["probe"]["counted"], honest.correctness["envelope"]["probe"]
