"""Prompts: rules, the one-shot example, feedback only when there is some, chat roles, backends."""

import pytest

from kb_gym import Evaluator, Problem
from kb_gym.extract import extract_code
from kb_gym.problems import check_problem_code
from kb_gym.prompts import (
    BACKENDS,
    CUDA_EXAMPLE,
    EXAMPLE_REFERENCE,
    TRITON_EXAMPLE,
    PromptBackend,
    build_messages,
    build_prompt,
    fence,
    get_backend,
    list_backends,
    observation_messages,
    observation_prompt,
    register_backend,
)

REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b) * 2.0


def get_inputs():
    return [torch.randn(64, 32), torch.randn(32, 16)]


def get_init_inputs():
    return []
'''
FEEDBACK = "Incorrect output: trial 1/5: 37% of values differ beyond atol=0.0001"
EXAMPLE_PROBLEM = Problem(id=0, name="0_ScaleAddReLU", level=1, code=EXAMPLE_REFERENCE, source="kb_gym.prompts")


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_prompt_holds_rules_example_and_reference(backend):
    prompt = build_prompt(REFERENCE, backend=backend)
    spec = get_backend(backend)
    assert REFERENCE.strip() in prompt
    assert spec.example_reference.strip() in prompt and spec.example_solution.strip() in prompt
    for rule in ("ModelNew", "same `__init__` arguments", "same `forward` arguments", "no speed credit",
                 "single Markdown code block fenced as python", "get_init_inputs()"):
        assert rule in prompt, rule
    assert spec.language in prompt
    assert "Feedback" not in prompt and "previous attempt" not in prompt
    assert prompt.index(spec.example_solution.strip()) < prompt.index(REFERENCE.strip())


def test_backend_specific_rules():
    triton, cuda = build_prompt(REFERENCE, backend="triton"), build_prompt(REFERENCE, backend="cuda")
    assert "@triton.jit" in triton and "load_inline" not in triton
    assert "load_inline" in cuda and "getCurrentCUDAStream" in cuda and "@triton.jit" not in cuda


def test_feedback_section_only_with_feedback():
    assert "Feedback on your previous attempt" not in build_prompt(REFERENCE, "")
    assert "Feedback on your previous attempt" not in build_prompt(REFERENCE, "  \n")
    prompt = build_prompt(REFERENCE, FEEDBACK)
    assert "Feedback on your previous attempt" in prompt and FEEDBACK in prompt
    assert prompt.index(REFERENCE.strip()) < prompt.index(FEEDBACK)
    with_code = build_prompt(REFERENCE, FEEDBACK, previous_code=TRITON_EXAMPLE, one_shot=False)
    assert "Your previous attempt" in with_code and TRITON_EXAMPLE.strip() in with_code


def test_one_shot_can_be_left_out():
    prompt = build_prompt(REFERENCE, one_shot=False)
    assert TRITON_EXAMPLE.strip() not in prompt and REFERENCE.strip() in prompt and "ModelNew" in prompt


def test_messages():
    messages = build_messages(REFERENCE, FEEDBACK, "cuda")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert all(isinstance(m["content"], str) and m["content"] for m in messages)
    assert "Rules" in messages[0]["content"] and REFERENCE.strip() not in messages[0]["content"]
    assert REFERENCE.strip() in messages[1]["content"] and FEEDBACK in messages[1]["content"]
    assert build_prompt(REFERENCE, FEEDBACK, "cuda") == "\n\n".join(m["content"] for m in messages)
    single = build_messages(REFERENCE, backend="triton", system=False)
    assert [m["role"] for m in single] == ["user"] and "Rules" in single[0]["content"]


def test_observation_helpers():
    obs = {"reference": REFERENCE, "feedback": FEEDBACK}
    assert observation_prompt(obs) == build_prompt(REFERENCE, FEEDBACK)
    assert observation_messages(obs, "cuda") == build_messages(REFERENCE, FEEDBACK, "cuda")


def test_unknown_backend_lists_known_ones():
    with pytest.raises(ValueError, match="Known backends: cuda, triton") as err:
        build_prompt(REFERENCE, backend="vulkan")
    assert "vulkan" in str(err.value)
    assert set(list_backends()) >= {"triton", "cuda"} and get_backend(" Triton ") is BACKENDS["triton"]


def test_register_backend():
    mine = PromptBackend("tilelang-test", "TileLang", ("Use TileLang.",), EXAMPLE_REFERENCE, TRITON_EXAMPLE)
    try:
        register_backend(mine)
        assert "Use TileLang." in build_prompt(REFERENCE, backend="tilelang-test")
        with pytest.raises(ValueError, match="already registered"):
            register_backend(PromptBackend("tilelang-test", "x", (), "", ""))
    finally:
        BACKENDS.pop("tilelang-test", None)


def test_fence_outgrows_backticks_in_code():
    code = 'doc = """```python\nx\n```"""'
    block = fence(code)
    assert block.startswith("````python\n") and block.endswith("\n````")
    assert fence("x = 1\n") == "```python\nx = 1\n```"


@pytest.mark.parametrize("solution", [TRITON_EXAMPLE, CUDA_EXAMPLE], ids=["triton", "cuda"])
def test_examples_are_valid_candidates(solution):
    check_problem_code(EXAMPLE_REFERENCE, "the one-shot reference")
    completion = f"Here is my kernel.\n\n{fence(solution)}\n\nIt fuses the three operations."
    found = extract_code(completion)
    assert found.code is not None and found.code.strip() == solution.strip()
    compile(found.code, "example", "exec")
    prompt = build_prompt(REFERENCE)
    assert extract_code(prompt).code is not None  # no stray fence in the prose breaks the blocks apart
    assert "```" not in "".join(line for line in prompt.splitlines() if not line.startswith("```"))


@pytest.mark.slow
def test_triton_example_is_correct_on_cpu():
    with Evaluator("cpu", results_path=False, trials=2, timing_max_reps=10, timing_min_reps=3,
                   timing_max_seconds=2) as ev:
        result = ev.evaluate(EXAMPLE_PROBLEM, fence(TRITON_EXAMPLE))
    assert result.status == "correct", result.feedback
    assert "no_custom_kernel" not in result.flags


@pytest.mark.gpu
@pytest.mark.parametrize("solution", [TRITON_EXAMPLE, CUDA_EXAMPLE], ids=["triton", "cuda"])
def test_examples_are_correct_on_gpu(solution):
    with Evaluator("cuda:0", results_path=False, trials=3, timing_max_reps=30) as ev:
        result = ev.evaluate(EXAMPLE_PROBLEM, fence(solution))
    assert result.status == "correct", result.feedback
    assert not result.flags, result.flags
