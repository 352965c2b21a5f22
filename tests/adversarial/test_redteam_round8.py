"""Red team, round 8: state that outlives one candidate (the baseline cache, a problem's calibration, the spare) and
the layers above the judge (dedup in the reward function, extraction).

Each test asserts what a sound system does. The two attacks that got through when this pass was made (session 17)
are stopped since. Candidates run with ``integrity="off"`` unless said otherwise
(the design must hold when a static check misses).
"""

from __future__ import annotations

import time

import pytest
from device import DEVICE
from test_judge_isolation import CHECK, GELU, HONEST

from kb_gym import EvalConfig, Evaluator, Problem
from kb_gym.baseline_cache import BaselineCache
from kb_gym.training.dedup import DedupEvaluator, program_key


@pytest.fixture(scope="module")
def ev():
    with Evaluator(DEVICE, results_path=False, baseline_cache=False) as e:
        yield e


# --- 1. a baseline-only job timed while another worker's candidate is in its load stage ---------------------
#
# With ``workers_per_device > 1`` a worker takes the device lock only after its load stage (workers.py
# WorkerHandle._run on "acquire", job.py _pipeline ``ctx.acquire_device()`` after the load): importing candidate
# code runs beside the other worker's correctness and timing, by design (docs/evaluation.md, "Several workers per
# device"). But under ``reuse_cached_baseline`` (the ``rl`` preset) the first candidate of a problem makes the
# evaluator time a baseline-only job (evaluator._run_on, implicit) whose timing goes into the baseline cache and
# is then trusted for every later candidate of that problem on that hardware. Round 4 made sure no candidate's
# processes of the *same* worker are alive then; a candidate of the *other* worker, still importing, is. Here
# candidate A (problem GELU) burns both cores for 9 s at import: three forked children and its own thread, each
# in a session of its own (``setsid``: on this host ``sched_autogroup`` otherwise gives A's whole zygote session one
# share, which kept the judge's baseline clean in the first tries). Meanwhile the first candidate of another
# problem (B, a 768 x 768 matmul + GELU, ~11-15 ms eager) arrives at the other worker: its baseline-only job is
# timed under the burn. Measured: evaluate_reference during the burn 34-35 ms against 10-12 ms clean; in this
# test the cached baseline 33-44 ms against 13.3-13.4 ms clean, and a later honest copy of the reference on that
# problem ``correct`` at 3.7x, no flags (the cache is never re-measured). Without ``setsid`` (a strict-legal burner of torch matmuls at import) the
# judge's baseline stayed clean on this host, thanks to autogroup alone; on a GPU a load-stage burner needs no
# such trick (kernels launched at import share the GPU with the other worker's baseline: not measured here).
# Fix: time baseline-only jobs for the cache with the device lock *and* no other worker of the device in its
# load stage (a host-wide "quiet" lock that load stages also take shared), or check a fresh baseline against a
# second measurement taken later (keep the smaller / re-measure when they disagree), or freeze the other
# workers' runner trees while a baseline destined for the cache is timed.
# Stopped since (session 17): the quiet lock (device_lock.DeviceLock.begin_quiet/begin_load): a baseline-only job
# waits for the loads already running on its device and new loads wait for it. Cached 15.8 ms against 13.0 clean
# here after the fix (33-44 against 13.3 before). The wait is bounded (workers.QUIET_WAIT_S, session 18: a candidate
# asleep in its import stalled it for its load limit); a baseline timed after a cut wait is kept nowhere.
# Still open: loads of *other* devices' workers on the host.

MATMUL = Problem(id=8, name="8_MatmulGelu", level=1, code='''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return torch.nn.functional.gelu(a @ b)

def get_inputs():
    return [torch.randn(768, 768), torch.randn(768, 768)]

def get_init_inputs():
    return []
''')

HONEST_MATMUL = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.nn.functional.gelu(a @ b)
'''

BURN_AT_IMPORT = '''
import os, time
import torch
import torch.nn as nn

_end = time.time() + 9.0
_kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        while time.time() < _end:
            pass
        os._exit(0)
    _kids.append(pid)
while time.time() < _end:
    pass
for pid in _kids:
    os.waitpid(pid, 0)

class ModelNew(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.erf(x / 2.0 ** 0.5))
'''

RL = EvalConfig(reuse_cached_baseline=True, timing_target_rel_ci=0.02, timing_min_reps=10, timing_max_reps=60,
                timing_max_seconds=2.0, timing_warmup=2, trials=2, integrity="off", load_timeout=60,
                correctness_timeout=30, timing_timeout=60)


def test_a_cached_baseline_is_not_timed_beside_another_workers_load_stage(tmp_path):
    cache = BaselineCache(tmp_path / "baselines.json")
    with Evaluator(DEVICE, config=RL, results_path=False, baseline_cache=cache, workers_per_device=2) as e:
        e.warm()
        burner = e.submit(GELU, BURN_AT_IMPORT, config=RL.replace(reuse_cached_baseline=False, timing=False))
        time.sleep(1.5)  # A is importing: its burn has begun
        first = e.submit(MATMUL, HONEST_MATMUL)  # the problem's first candidate: a baseline-only job, then itself
        first.result()
        assert burner.result().status == "correct"
        cached = next(iter(cache.with_prefix(MATMUL.code_hash).values()))["ref_runtime_ms"]
        later = e.evaluate(MATMUL, HONEST_MATMUL)  # an honest copy of the reference, after the burn
        clean = max(e.evaluate_reference(MATMUL, config=RL.replace(reuse_cached_baseline=False)).ref_runtime_ms
                    for _ in range(2))
    # poisoned: 2.5-3.3x clean and the honest copy at 3.7x; with the quiet lock 1.0-1.5x here (two busy cores)
    assert cached < 2.0 * clean, (cached, clean)
    assert later.speedup is not None and later.speedup < 2.0, (later.speedup, later.ref_runtime_ms, later.runtime_ms)


# --- 2. dedup hands an over-long answer the verdict of the short one with the same code ---------------------
#
# training/dedup.py keys an answer by (problem, the code extract_code finds). The Evaluator's _precheck first
# refuses a text over MAX_TEXT_CHARS (1,000,000 characters) as ``format_error`` before extracting. Two answers
# with the same program, one of them padded past the limit, share a key: the padded one gets the short one's
# Future (``correct``, its speedup) in the reward function's batch (dedup="batch", the default) and for the
# whole run with dedup="run", instead of the format_error it gets alone. Small (the policy must also write the
# short copy in the same group), but the verdict of a text depends on its siblings.
# Fix: put what _precheck decides on the text itself (its length, non-text) into program_key, e.g. key every
# text over MAX_TEXT_CHARS by its own hash, or run Evaluator._precheck before the dedup lookup.
# Stopped since (session 17): such a text is keyed by its own hash.

def test_dedup_gives_an_over_long_answer_its_own_verdict(ev):
    from kb_gym.evaluator import MAX_TEXT_CHARS

    short = f"```python\n{HONEST}```\n"
    padded = "x" * (MAX_TEXT_CHARS + 10) + "\n" + short
    assert ev.submit(GELU, padded, config=CHECK).result().status == "format_error"  # alone: refused
    dedup = DedupEvaluator(ev)
    assert dedup.submit(GELU, short, config=CHECK).result().status == "correct"
    assert dedup.submit(GELU, padded, config=CHECK).result().status == "format_error"


def test_dedup_keys_differ_where_the_extracted_program_differs():
    """Answers that extract to different programs never share a verdict: drafts before the final block, another
    language's block, a block that only mentions ModelNew in prose, NUL bytes (keyed by the whole text)."""
    final = f"```python\n{HONEST}```"
    draft = "```python\nclass ModelNew: pass\n```\n" + final
    assert program_key("p", draft) == program_key("p", final)  # the last block is the program in both
    other_lang = f"```cuda\n{HONEST}```\n```python\nclass ModelNew: pass\n```"
    assert program_key("p", other_lang) != program_key("p", final)
    assert program_key("p", final + "\x00") != program_key("p", final)
    assert program_key("p", final) != program_key("q", final)
