"""One forward of the candidate at the end of its load, outside the device lock (kb_gym/worker/load_forward.py):
where it runs, what the runner does with it, and that verdicts are the trials' as before."""

from __future__ import annotations

import types

import pytest
import torch

from kb_gym import EvalConfig, Evaluator, get_problem, load_problems
from kb_gym.worker import load_forward
from kb_gym.worker.runner import Runner

CUDA, CPU = torch.device("cuda:0"), torch.device("cpu")


def test_it_runs_only_where_switched_on_on_a_gpu_and_for_outputs_of_known_small_size(monkeypatch):
    assert load_forward.spec(CUDA, 7, 1 << 20) is None  # off by default
    monkeypatch.setenv(load_forward.ENV, "1")
    assert load_forward.spec(CUDA, 7, 1 << 20) == {"seed": 7, "output_bytes": 1 << 20,
                                                   "max_bytes": load_forward.MAX_BYTES}
    assert load_forward.spec(CPU, 7, 1 << 20) is None  # host work beside another job's timing
    assert load_forward.spec(CUDA, 7, 0) is None  # the outputs' size unknown
    assert load_forward.spec(CUDA, 7, load_forward.MAX_BYTES + 1) is None
    monkeypatch.setenv(load_forward.ENV, "force")
    assert load_forward.spec(CPU, 7, 1 << 20) is not None


PROBLEM = types.SimpleNamespace(get_inputs=lambda: [torch.randn(64, 32)])


def _runner(model, module=PROBLEM):
    return types.SimpleNamespace(ref_mod=module, dtype=torch.float32, device=CPU, model=model)


def test_the_runner_runs_one_forward_on_the_seeds_inputs_and_drops_its_outputs():
    seen = []
    told = Runner._load_forward(_runner(lambda x: seen.append(x.clone()) or x * 2),
                                {"seed": 11, "output_bytes": 64 * 32 * 4, "max_bytes": 1 << 20})
    assert told["ran"] and told["why"] == "" and len(seen) == 1 and seen[0].shape == (64, 32)
    torch.manual_seed(11)
    assert torch.equal(seen[0], torch.randn(64, 32))  # the inputs make_inputs draws for that seed


def test_a_forward_that_raises_is_left_for_the_trials_and_large_or_unknown_inputs_are_not_made():
    def raises(x):
        raise ValueError("wrong")

    told = Runner._load_forward(_runner(raises), {"seed": 1, "output_bytes": 0, "max_bytes": 1 << 20})
    assert told["ran"] and told["why"] == "ValueError"
    calls = []
    big = Runner._load_forward(_runner(calls.append), {"seed": 1, "output_bytes": 0, "max_bytes": 1000})
    assert not big["ran"] and big["why"] == "8192 bytes" and not calls  # 64 x 32 floats: over 1,000 bytes
    unknown = types.SimpleNamespace(get_inputs=lambda: [torch.randn(4) * torch.randn(1).item()])  # no value on meta
    told = Runner._load_forward(_runner(calls.append, unknown), {"seed": 1, "output_bytes": 0, "max_bytes": 1 << 20})
    assert not told["ran"] and not calls


HONEST = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
RAISES = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        raise ValueError('no')\n"


@pytest.fixture(scope="module")
def relu():
    return get_problem(load_problems("builtin"), name="level1/1_ReLU")


def test_verdicts_are_the_trials_with_the_forward_after_the_load(monkeypatch, relu):
    monkeypatch.setenv(load_forward.ENV, "force")  # the judges inherit it
    with Evaluator("cpu", config=EvalConfig(trials=2, timing=False), results_path=False) as ev:
        honest, raising = ev.evaluate(relu, HONEST), ev.evaluate(relu, RAISES)
    assert honest.status == "correct" and honest.worker["load_forward"]["ran"], honest.worker.get("load_forward")
    # a request of its own after the load: how long other judges' measurements waited for it (none here)
    assert honest.worker["load_forward"]["measurements_waited_s"] == 0.0
    assert raising.status == "runtime_error" and "trial 1/2" in raising.error, raising.error
    assert raising.worker["load_forward"] == {**raising.worker["load_forward"], "ran": True, "why": "ValueError"}
