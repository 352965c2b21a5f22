"""Red team, round 10: the layers above the judge. The answer text on its way to the Evaluator (env.step, the TRL
reward function, the tool environment and its prefetch, ``kb-gym evaluate-model``), repeated submissions in the
tool environment, the dedup key, and the results store read back after a torn line.

Each test asserts what a sound system does. All of them got through when this pass was made (session 18, a helper's
pass) and are stopped since: what the parser gives up on is the answer's compile_error and any failure of the
precheck a recorded crash verdict (Evaluator.submit; the Ray service turns a worker's exception into one too); the
tool environment's prefetch skips arguments that are not an object; a program submitted again within one episode
(env, tool environment, multi-turn rollout) gets its first verdict; program keys and source hashes keep lone
surrogates apart (surrogatepass); the store closes a torn line before appending, and evaluate-model counts every
task. Nothing here reaches a worker process: the texts below are decided in the Evaluator's precheck.
"""

from __future__ import annotations

import json
from concurrent.futures import Future

import pytest

from kb_gym import EvalConfig, Evaluator, get_problem, load_problems
from kb_gym.result import EvalResult
from kb_gym.rewards import get_reward

PROBLEMS = load_problems("builtin", size="cpu")
RELU = get_problem(PROBLEMS, name="level1/1_ReLU")
LIGHT = EvalConfig(trials=1, timing=False)
HEAD = "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"

# ~60 KB of answer (6% of MAX_TEXT_CHARS, a third of max_source_chars): a chained expression deeper than
# CPython's parser will build. ast.parse raises RecursionError ("maximum recursion depth exceeded during ast
# construction"), not SyntaxError; a unary chain of 8,000 raises MemoryError.
DEEP_SUM = "```python\n" + HEAD + "A = " + "+".join(["1"] * 30000) + "\n```"
DEEP_NOT = "```python\n" + HEAD + "A = " + "not " * 20000 + "1\n```"
# A lone surrogate: what a JSON tool call's "\ud800" escape decodes to. ast.parse raises UnicodeEncodeError.
SURROGATE = "```python\n" + HEAD + "A = '\ud800'\n```"
HOSTILE = {"deep_sum": DEEP_SUM, "deep_not": DEEP_NOT, "surrogate": SURROGATE}


@pytest.fixture(scope="module")
def ev():
    with Evaluator("cpu", config=LIGHT, results_path=False, baseline_cache=False) as e:
        yield e


# --- 1. text the precheck's ast.parse cannot parse without raising ---------------------------------------------------
#
# Mechanism: ``Evaluator._precheck`` catches only ``SyntaxError`` around ``ast.parse(found.code)``. CPython raises
# RecursionError for a chain of ~4,000 operators (``1+1+...``, ``x.y.y...``, ``f()()...``, ``a if b else ...``),
# MemoryError for ~8,000 unary operators (``not not ...``, ``lambda: lambda: ...``) and UnicodeEncodeError for a
# lone surrogate. ``submit`` is documented "never raises for bad input"; it raises, synchronously, in the caller.
# Measured: all three raise out of Evaluator.submit in < 0.1 s (3 of 3 runs), at 60 KB of answer.
# Why it matters: one sampled completion stops the caller. env.step raises (test 2); KernelRewardFunction raises out of
# the trainer's reward call with the rest of the batch already queued (test 3); evaluate-model dies on it, and dies
# again on every resume because the completion is on disk (test 4); the tool env's prefetch raises outside TRL's
# try (test 5); the Ray service, by reading (not run here), re-raises it (EvaluationService.evaluate
# catches only RayActorError) and records nothing. The verdict a sound
# judge gives is compile_error (the compiler cannot build it either), recorded like any other.

@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_text_the_parser_cannot_build_gets_a_verdict_not_an_exception(ev, name, tmp_path):
    from kb_gym.store import ResultsStore

    ev_store, ev.store = ev.store, ResultsStore(tmp_path / "results.jsonl")
    try:
        result = ev.submit(RELU, HOSTILE[name]).result(timeout=60)
    finally:
        ev.store = ev_store
    assert result.status in ("compile_error", "format_error"), (result.status, result.error)
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 1  # recorded like every other verdict


# --- 2. the same text through env.step ---------------------------------------------------------------------------------
#
# Mechanism: KernelBenchEnv.step calls evaluator.submit (test 1) with no guard. Measured: step raises RecursionError;
# the episode's turn counter is not advanced, no reward, no info. Why it matters: a Gymnasium training loop (or an
# AsyncVectorEnv worker) dies on one sampled action; the action space (CodeText, any str up to 1,000,000 chars)
# admits the text.

def test_env_step_on_an_unparseable_answer_returns_a_verdict(ev):
    from kb_gym.envs import KernelBenchEnv

    env = KernelBenchEnv(dataset=[RELU], evaluator=ev, trials=1, timing=False)
    env.reset(seed=0)
    assert env.action_space.contains(DEEP_SUM)
    _, reward, terminated, _, info = env.step(DEEP_SUM)
    assert info["status"] == "compile_error" and terminated and reward == pytest.approx(-0.5)


# --- 3. the same text through the TRL reward function ---------------------------------------------------------------
#
# Mechanism: KernelRewardFunction.__call__ submits the whole batch in a loop before waiting; the hostile completion's
# submit raises in the middle of it. Measured: __call__ raises RecursionError for a batch of [prose, DEEP_SUM, prose];
# no rewards are returned and nothing is logged (the first completion's verdict was already recorded, the third never
# submitted). Why it matters: GRPOTrainer's reward call has no guard; one completion out of a generation batch ends
# the training run, and a policy that drifts towards long operator chains does so reliably.

def test_reward_function_scores_a_batch_holding_an_unparseable_completion(ev):
    from kb_gym.training.reward_function import KernelRewardConfig, KernelRewardFunction

    fn = KernelRewardFunction(KernelRewardConfig(dataset=[RELU], size="cpu"), evaluator=ev)
    rewards = fn(prompts=["p"] * 3, completions=["no code here", DEEP_SUM, "still no code"],
                 problem_key=[RELU.key] * 3)
    assert len(rewards) == 3 and rewards[1] == pytest.approx(-0.5), rewards


# --- 4. evaluate-model on an unparseable answer, and its resume ------------------------------------------------------
#
# Mechanism: evaluate_model writes the completion to completions.jsonl, then submits every answer in one list
# comprehension; the hostile answer's submit raises, nothing is recorded for any answer of the run, and a resume
# reads the same completion back from disk and raises again. Measured: RecursionError on the first run and on the
# resume (2 of 2 runs each, 3 of 3 test runs); results.jsonl never created; no summary. Why it matters: one answer
# of one sample of one problem makes a checkpoint's fast_p table impossible to produce.

def test_evaluate_model_finishes_with_an_unparseable_answer_on_disk(tmp_path):
    from kb_gym.training.evaluate_model import ModelEvalConfig, evaluate_model

    cfg = ModelEvalConfig(model="fixed-policy", dataset=[RELU, PROBLEMS[1]], samples=1, eval_devices="cpu",
                          out_dir=str(tmp_path), eval_config={"trials": 1, "timing": False})
    for _ in range(2):  # the first run, then a resume over the same folder
        try:
            summary = evaluate_model(cfg, generate=lambda batch: [DEEP_SUM, "prose only"][:len(batch)])
            break
        except RecursionError:
            continue
    else:
        pytest.fail("evaluate_model raised RecursionError on the run and on its resume")
    assert summary["all"]["n_tasks"] == 2 and summary["all"]["correct"] == 0.0


# --- 5. the tool environment's prefetch: a tool call's arguments that are not an object ------------------------------
#
# Mechanism: ``overlap_tool_calls`` wraps TRL's tool loop; before the loop (and on every message TRL appends) it calls
# ``KernelToolEnv._prefetch``, outside TRL's own try/except around tool calls. ``_prefetch`` does
# ``(function.get("arguments") or {}).get("code")``: TRL's parse_response validates that ``function`` is a dict and
# ``name`` a string but not the type of ``arguments`` (_validate_tool_calls); a model that writes
# ``{"name": "submit_kernel", "arguments": "..."}`` gets a string there. And a well-formed call whose code is DEEP_SUM
# reaches ``evaluator.submit`` (test 1) in the same unguarded place. Measured: AttributeError ('str' object has no
# attribute 'get') and RecursionError out of the wrapped loop (3 of 3 runs), before TRL's loop ran. TRL itself
# answers both calls with {"error": ...} and carries on. Why it matters: one malformed tool call ends the GRPO step.

def _fake_trainer(env):
    trainer = type("FakeTrainer", (), {})()
    trainer._sync_tool_dicts = [{"submit_kernel": env.submit_kernel}]
    trainer.calls = []
    trainer._tool_call_loop = lambda *args: trainer.calls.append(args) or "inner ran"
    return trainer


@pytest.mark.parametrize("arguments", ["def forward(): pass", ["code"], {"code": DEEP_SUM}],
                         ids=["string", "list", "deep_code"])
def test_tool_call_prefetch_survives_any_arguments_the_model_writes(ev, arguments):
    from kb_gym.training.tool_env import KernelToolEnvFactory, overlap_tool_calls

    factory = KernelToolEnvFactory([RELU], evaluator=ev, size="cpu")
    env = factory()
    env.reset(problem_key=RELU.key)
    trainer = overlap_tool_calls(_fake_trainer(env))
    message = {"role": "assistant", "content": "",
               "tool_calls": [{"type": "function", "function": {"name": "submit_kernel", "arguments": arguments}}]}
    assert trainer._tool_call_loop(["p"], None, None, [[message]]) == "inner ran"


# --- 6. the same program submitted again in one tool rollout: the best of several timings -----------------------------
#
# Mechanism: KernelToolEnv.submit_kernel evaluates every call afresh (no program key, unlike training/dedup.py, whose
# own docstring says "timing the same program again buys only noise"), and score="best" pays the maximum. A policy
# that submits its correct kernel max_submissions times is paid the best of that many draws of timing noise. An
# Evaluator stand-in returns the verdicts a real judge gives the same program four times (speedups 1.00, 1.06, 0.97,
# 1.03: a few percent, the spread of a CPU or a shared GPU's timing). Measured: episode reward 0.4168 (the 1.06 draw)
# against 0.4 for the first verdict; with fast_p (p=1) a program at speedup 1.00 scores 1.0 once any draw lands above
# 1. The multi-turn rollout (episode="best") and the env's "improvement" mode pay the same maximum for a program
# repeated turn after turn. Why it matters: a reward for repeating oneself, on a noise the policy cannot improve.

class _NoisyJudge:
    """The same correct program, four timings: what the tool env sees from a real judge, without running one."""

    devices = ["cpu"]

    def __init__(self, speedups):
        self.speedups = list(speedups)

    def submit(self, problem, text, **_):
        future = Future()
        future.set_result(EvalResult(status="correct", problem_name=problem.name, level=problem.level,
                                     speedup=self.speedups.pop(0), speed_credit=True, feedback="ok"))
        return future

    def evaluate(self, problem, text, **kwargs):
        return self.submit(problem, text, **kwargs).result()


@pytest.mark.parametrize("reward", ["default", "fast_p"])
def test_a_program_resubmitted_in_one_rollout_is_not_paid_its_best_timing_draw(reward):
    from kb_gym.training.tool_env import KernelToolEnvFactory

    factory = KernelToolEnvFactory([RELU], evaluator=_NoisyJudge([1.00, 1.06, 0.97, 1.03]), size="cpu",
                                   reward=reward, max_submissions=4)
    env = factory()
    env.reset(problem_key=RELU.key)
    program = "```python\n" + HEAD + "```"
    for _ in range(4):
        env.submit_kernel(program)
    first = get_reward(reward)(EvalResult(status="correct", speedup=1.00, speed_credit=True))[0]
    assert env._episode_reward() == pytest.approx(first)


# --- 7. the dedup key of a program holding a lone surrogate ------------------------------------------------------------
#
# Mechanism: ``training.dedup.program_key`` hashes ``body.encode("utf-8", "replace")``: every lone surrogate becomes
# "?", so ``A = '?'`` and ``A = '\ud800'`` (two programs, and not the same one: the second does not even parse, test 1)
# share a key and the second copy in a batch is handed the first one's Future. The evaluator's ``source_hash`` uses
# the same ``errors="replace"`` encoding. Measured: equal keys (deterministic). Why it matters: a key that maps two
# programs to one verdict; a lone surrogate reaches the text through a JSON tool call ("\ud800"). With test 1 fixed
# the surrogate program is a compile_error that would be paid the "?" program's correct verdict.

def test_two_programs_differing_in_a_lone_surrogate_have_different_dedup_keys():
    from kb_gym.training.dedup import program_key

    plain = "```python\n" + HEAD + "A = '?'\n```"
    assert program_key(RELU.key, plain) != program_key(RELU.key, SURROGATE)


# --- 8. the results store after a torn line ----------------------------------------------------------------------------
#
# Mechanism: ResultsStore.append opens the file in "a" mode and writes one line; it does not check that the file ends
# in a newline. A process killed in the middle of a write (a line longer than the buffer is several write calls; a
# full disk writes part of one) leaves a torn last line, and evaluate_model's own reader says so ("a torn last line is
# ignored"). The next append lands on the same line: both are one corrupt line to metrics.load_results. Measured:
# after a torn line, an appended result is not read back (0 of 1 records, n_corrupt 1; 3 of 3 runs).
# Why it matters: the store's promise is "nothing already returned is lost"; the first verdict after every crash is.

def test_a_result_appended_after_a_torn_line_is_read_back(tmp_path):
    from kb_gym.metrics import load_results
    from kb_gym.store import ResultsStore

    path = tmp_path / "results.jsonl"
    path.write_text('{"status": "correct", "problem_na')  # a writer killed mid-line
    ResultsStore(path).append(EvalResult(status="incorrect", problem_name="1_ReLU", level=1))
    loaded = load_results(path)
    assert [r["status"] for r in loaded] == ["incorrect"], (len(loaded), loaded.n_corrupt)


# --- 9. evaluate-model resumed after a torn results line: a failure drops out of the denominator ----------------------
#
# Mechanism: on resume ``_done`` skips the torn line, so that sample is evaluated again and appended, onto the torn
# line (test 8); ``summarize`` is then called without ``tasks=``, so its denominator is the set of tasks it could read.
# An earlier run recorded problem A correct at 2x; problem B's line was torn by a crash. Measured: the resumed run's
# summary has n_tasks 1 and fast_1 1.0 (B's format_error lost) where it should say 2 tasks and fast_1 0.5; the next
# resume evaluates B once more (3 of 3 runs). Why it matters: a crash while a failure is written turns it into a
# missing task, and fast_p is over the tasks that remain.

def test_evaluate_model_resumed_after_a_torn_results_line_keeps_every_task(tmp_path):
    from kb_gym.training.evaluate_model import ModelEvalConfig, evaluate_model

    a, b = RELU, PROBLEMS[1]
    cfg = ModelEvalConfig(model="m", dataset=[a, b], samples=1, eval_devices="cpu", out_dir=str(tmp_path),
                          eval_config={"trials": 1, "timing": False})
    with open(tmp_path / "completions.jsonl", "w") as fh:
        for p in (a, b):
            fh.write(json.dumps({"model": "m", "problem_key": p.key, "sample": 0, "completion": "no code"}) + "\n")
    done = EvalResult(status="correct", problem_name=a.name, level=a.level, speedup=2.0, speed_credit=True)
    with open(tmp_path / "results.jsonl", "w") as fh:
        fh.write(json.dumps({**done.to_dict(), "model": "m", "problem_key": a.key, "sample": 0}) + "\n")
        fh.write('{"status": "format_error", "problem_name": "' + b.name)  # torn by a crash
    summary = evaluate_model(cfg, generate=lambda batch: pytest.fail("nothing left to generate"))
    assert summary["all"]["n_tasks"] == 2 and summary["all"]["fast_1"] == pytest.approx(0.5), summary["all"]


# --- the same for an answer: a torn line in evaluate-model's completions.jsonl --------------------------------------
#
# Round 10's pass named it, not measured: generation appended its batch after a line torn by a killed run, so the
# first regenerated answer was glued to it and lost again. The completions file is appended through the store's
# own append_lines, which closes a torn line first.

def test_an_answer_generated_after_a_torn_completions_line_is_kept(tmp_path):
    from kb_gym.training.evaluate_model import ModelEvalConfig, evaluate_model

    a, b = RELU, PROBLEMS[1]
    cfg = ModelEvalConfig(model="m", dataset=[a, b], samples=1, eval_devices="cpu", out_dir=str(tmp_path),
                          eval_config={"trials": 1, "timing": False})
    with open(tmp_path / "completions.jsonl", "w") as fh:
        fh.write(json.dumps({"model": "m", "problem_key": a.key, "sample": 0, "completion": "no code"}) + "\n")
        fh.write('{"model": "m", "problem_key": "' + b.key)  # torn by a crash
    asked: list[int] = []

    def generate(batch):
        asked.append(len(batch))
        return ["no code either"] * len(batch)

    summary = evaluate_model(cfg, generate=generate)
    assert asked == [1] and summary["all"]["n_tasks"] == 2
    evaluate_model(cfg, generate=lambda batch: pytest.fail("the regenerated answer was lost"))  # a resume
