"""One GRPO step on the GPU: the policy and the evaluator's worker share the device."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_grpo_step_with_the_policy_and_the_worker_on_one_gpu(tiny_lm, tmp_path):
    from kb_gym.training.grpo import GRPOKernelConfig, build_trainer

    model, tokenizer = tiny_lm
    cfg = GRPOKernelConfig(model="tiny", level=1, one_shot=False, eval_devices="cuda:0",
                           eval_config={"trials": 2}, results_path=str(tmp_path / "r.jsonl"),
                           grpo={"per_device_train_batch_size": 2, "num_generations": 2, "max_completion_length": 8,
                                 "max_steps": 1, "logging_steps": 1, "save_strategy": "no", "bf16": False,
                                 "output_dir": str(tmp_path / "out")})
    trainer, reward_fn = build_trainer(cfg, model=model, processing_class=tokenizer)
    try:
        trainer.train()
        relu = reward_fn.problems["level1/1_ReLU"]
        from kb_gym.problems import BUILTIN_DIR

        solution = (BUILTIN_DIR / "solutions" / "level1" / "1_ReLU.py").read_text()
        rewards = reward_fn(completions=[f"```python\n{solution}```"], problem_key=[relu.key])
    finally:
        reward_fn.close()
    assert "kernel_reward/correct" in trainer.state.log_history[0]
    assert reward_fn.last_results[0].status == "correct" and rewards[0] > 0
    assert next(trainer.model.parameters()).is_cuda
