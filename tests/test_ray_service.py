"""The Ray evaluation service on a local cluster with fake GPU resources and CPU workers (issue: one service for
every trainer rank): the same verdicts as the local backend, nothing lost when a worker dies mid-batch, two
client processes sharing one service, and Ray imported only when asked for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kb_gym import EvalConfig, Evaluator, get_problem, load_problems
from kb_gym.problems import reference_as_candidate

ray = pytest.importorskip("ray")

RELU = get_problem(load_problems("builtin", size="cpu"), name="level1/1_ReLU")
CONFIG = EvalConfig(trials=2, timing=False)
COPY = reference_as_candidate(RELU)
assert "return torch.clamp_min(inp, 0.0)" in COPY  # the line the candidates below change
CANDIDATES = {
    "reference": COPY,
    "wrong": COPY.replace("return torch.clamp_min(inp, 0.0)", "return torch.clamp_min(inp, 0.0) * 1.5"),
    "raises": "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        raise ValueError('no')\n",
    "syntax": "```python\nclass ModelNew(:\n```",
    "no_code": "I would write a kernel here.",
}
SLOW = COPY.replace("return torch.clamp_min(inp, 0.0)", "time.sleep(1.5)\n        return torch.clamp_min(inp, 0.0)").replace(
    "import torch\n", "import time\nimport torch\n", 1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway local cluster
    # 4 logical CPUs on this 2-core machine: the service's two workers and the batch bench's one each reserve one
    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False, namespace="kb_gym")
    yield tmp_path_factory.mktemp("ray_service")
    ray.shutdown()


@pytest.fixture(scope="module")
def service(cluster):
    from kb_gym.service import RayEvaluator, stop_service

    results = cluster / "results.jsonl"
    ev = RayEvaluator(address=None, name="kb_gym_test", workers=2, config=CONFIG, results_path=str(results))
    yield ev, results
    stop_service("kb_gym_test")


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_service_gives_the_verdicts_the_local_backend_gives(service):
    ev, _ = service
    assert ev.devices == ["cpu", "cpu"]  # one worker per (fake) GPU; no CUDA here, so each measures on the CPU
    remote = {name: ev.evaluate(RELU, text) for name, text in CANDIDATES.items()}
    with Evaluator("cpu", config=CONFIG, results_path=False, baseline_cache=False) as local_ev:
        local = {name: local_ev.evaluate(RELU, text) for name, text in CANDIDATES.items()}
    for name in CANDIDATES:
        assert (remote[name].status, sorted(remote[name].flags)) == (local[name].status, sorted(local[name].flags)), name
    assert remote["reference"].status == "correct" and remote["wrong"].status == "incorrect"
    # the judges run with the thread setting of the process that started the service, not the 1 Ray gives an actor
    workers = ray.get(ev.service.ready.remote())
    assert {w["omp_num_threads"] for w in workers} == {os.environ.get("OMP_NUM_THREADS")}, workers


def test_a_worker_killed_mid_batch_loses_nothing_and_every_result_is_stored_once(service):
    ev, results = service
    before = len(_lines(results))
    futures = [ev.submit(RELU, SLOW) for _ in range(6)]
    time.sleep(4)  # both workers busy on a 1.5 s forward
    victim = ray.get(ev.service.ready.remote())[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    got = [f.result(timeout=600) for f in futures]
    assert [r.status for r in got] == ["correct"] * 6, [(r.status, r.error) for r in got]
    assert ev.stats()["replaced"] >= 1
    stored = _lines(results)[before:]
    assert len(stored) == 6 and sorted(r["source_hash"] for r in stored) == sorted(r.source_hash for r in got)


def test_two_client_processes_share_one_service(service):
    ev, results = service
    before = len(_lines(results))
    address = ray.get_runtime_context().gcs_address
    client = textwrap.dedent(f"""
        import json, ray
        ray.init(address={address!r}, namespace="kb_gym", log_to_driver=False)
        from kb_gym import EvalConfig, get_problem, load_problems
        from kb_gym.problems import reference_as_candidate
        from kb_gym.service import RayEvaluator
        p = get_problem(load_problems("builtin", size="cpu"), name="level1/1_ReLU")
        ev = RayEvaluator(name="kb_gym_test", start=False, config=EvalConfig(trials=2, timing=False))
        print(json.dumps([ev.evaluate(p, reference_as_candidate(p)).status for _ in range(2)]))
    """)
    other = subprocess.run([sys.executable, "-P", "-c", client], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")})
    assert other.returncode == 0, other.stderr[-2000:]
    assert json.loads(other.stdout.strip().splitlines()[-1]) == ["correct", "correct"]
    mine = [ev.evaluate(RELU, COPY).status for _ in range(2)]
    assert mine == ["correct", "correct"]
    assert len(_lines(results)) - before == 4  # one store, written by the service, for both clients


def test_a_client_without_a_running_service_is_told_how_to_start_one(cluster):
    from kb_gym.service import RayEvaluator

    with pytest.raises(RuntimeError, match="kb-gym serve"):
        RayEvaluator(address=None, name="kb_gym_nobody", start=False)


def test_import_kb_gym_does_not_import_ray_and_without_ray_the_error_names_the_extra():
    code = ("import sys, kb_gym, kb_gym.envs, kb_gym.rewards, kb_gym.training, kb_gym.service\n"
            "print('ray' in sys.modules)\n"
            "sys.modules['ray'] = None\n"
            "from kb_gym.service import RayEvaluator\n"
            "try:\n    RayEvaluator()\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.strip().splitlines()[-2:]
    assert first == "False" and "kb-gym[ray]" in second


def test_kb_gym_serve_describes_the_running_service_and_a_reward_function_scores_through_it(service):
    ev, _ = service
    address = ray.get_runtime_context().gcs_address
    out = subprocess.run([sys.executable, "-m", "kb_gym.cli", "serve", "--address", address, "--name", "kb_gym_test",
                          "--status"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 worker(s) on ['cpu']" in out.stdout
    from kb_gym.training import KernelRewardConfig, KernelRewardFunction

    reward = KernelRewardFunction(KernelRewardConfig(dataset=[RELU], eval_config=CONFIG), evaluator=ev)
    scores = reward(completions=[f"```python\n{COPY}\n```", "no code"], problem_key=[RELU.key, RELU.key])
    assert scores[0] > scores[1]
    assert [r.status for r in reward.last_results] == ["correct", "format_error"]


def test_the_batch_bench_runs_through_the_ray_backend(cluster, monkeypatch):
    """`kb-gym bench --batch --backend ray`: the throughput batch through the service, for the one-GPU comparison."""
    from kb_gym.batch_bench import run_batch

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    report = run_batch(device="cpu", size="cpu", problems=1, kernelbench_way_too=False, backend="ray")
    assert report["backend"] == "ray" and report["candidates"] == 4
    assert set(report["statuses"]["reference"]) == {"correct"} and set(report["statuses"]["wrong"]) == {"incorrect"}
    from kb_gym.service import RayEvaluator

    with pytest.raises(RuntimeError, match="kb-gym serve"):
        RayEvaluator(name="kb_gym_batch_bench", start=False)  # the bench's own service went with it


def test_a_baseline_measured_on_one_node_is_reused_on_another(tmp_path):
    """Two workers with separate on-disk caches (two nodes): the first measures the baseline (a baseline-only job
    on its miss), the service learns it from the first's cache and hands it to the second, which reuses it
    instead of measuring again. The service's logic without Ray: EvaluationWorker and SharedBaselines are plain
    classes."""
    from kb_gym.config import config_preset
    from kb_gym.service.actors import EvaluationWorker, SharedBaselines

    rl = config_preset("rl", trials=2, timing_max_reps=12, timing_max_seconds=2.0).to_dict()
    problem = RELU.to_dict()
    shared = SharedBaselines()
    first = EvaluationWorker(rl, str(tmp_path / "node_a.json"))
    second = EvaluationWorker(rl, str(tmp_path / "node_b.json"))
    try:
        measured, learned = first.evaluate(problem, COPY, None, rl, shared.for_problem(problem))
        assert measured["status"] == "correct" and measured["baseline_cached"], measured["error"]
        shared.learn(learned)
        assert len(shared.entries) == 1 and shared.for_problem(problem)
        assert shared.for_problem(load_problems("builtin", size="cpu")[1].to_dict()) == {}  # another problem: none
        reused, _ = second.evaluate(problem, COPY, None, rl, shared.for_problem(problem))
        assert reused["status"] == "correct" and reused["baseline_cached"], reused
        assert reused["ref_runtime_ms"] == measured["ref_runtime_ms"]
        assert len(second.evaluator.baselines) == 1  # it took the first's entry, and measured none of its own
    finally:
        first.shutdown()
        second.shutdown()
