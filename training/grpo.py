"""GRPO fine-tuning of any Hugging Face causal LM against kb_gym's evaluator (``kb-gym train``).

One process generates with the policy (TRL's ``GRPOTrainer``) and scores every completion with
:class:`~kb_gym.training.KernelRewardFunction`, whose Evaluator keeps one warm worker per GPU it is
given. On a single GPU the policy and the kernels share the device; on a node, give the evaluator
GPUs the trainer does not use (``eval_devices="cuda:6,cuda:7"``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kb_gym.config import CONFIG_PRESETS, config_preset
from kb_gym.problems import load_problems
from kb_gym.service import evaluator_address
from kb_gym.training.config_check import check_eval_config, check_grpo_config, check_keys
from kb_gym.training.dataset import build_prompt_dataset
from kb_gym.training.errors import ConfigError, ModelLoadError
from kb_gym.training.reward_function import KernelRewardConfig, KernelRewardFunction


@dataclass
class GRPOKernelConfig:
    """What ``kb-gym train`` needs beyond TRL's ``GRPOConfig``.

    Args:
        model: a Hugging Face model id or local path (any causal LM with a chat template when
            ``conversational``).
        dataset, level: the problems to train on (anything ``load_problems`` takes).
        size, split: the problems' size (``"auto"``: GPU size when ``eval_devices`` are all GPUs) and
            split (``"train"``, ``"test"``, None: all). Loaded once, so the prompts and the reward
            function see the same problems.
        backend: the prompt's kernel language (``"triton"`` or ``"cuda"``).
        conversational: chat-message prompts (the model's chat template applies) or plain strings.
        one_shot: include the worked example in every prompt.
        repeat: list every problem this many times per epoch.
        exclude: problem keys to leave out (``kb_gym.audit.passable_problems("audit.jsonl")``).
        reward, reward_kwargs: the reward preset by name, and its parameters.
        eval_devices: the evaluator's devices (``"auto"``: every visible GPU, else the CPU).
        evaluator: ``"local"`` (an Evaluator over ``eval_devices`` in each trainer process) or the Ray
            service every rank shares (``"ray"``, ``"ray://HOST:10001"``; docs/distributed.md).
        workers_per_device: the evaluator's warm workers per device.
        eval_preset: the EvalConfig preset the evaluations start from: ``"rl"`` (the default for
            training: the baseline timed once per problem and reused, a 5 s timing budget; measured in
            docs/benchmarks.md, 0b) or ``"default"``.
        eval_config: EvalConfig fields on top of the preset (``{"trials": 3}``).
        lora: LoRA adapter settings (peft ``LoraConfig`` fields, e.g. ``{"r": 16, "lora_alpha": 32,
            "target_modules": "all-linear"}``): train an adapter instead of every weight (``kb-gym[lora]``).
            vLLM generation is TRL's: ``grpo={"use_vllm": True, "vllm_mode": "colocate"}``.
        resume: continue from a checkpoint in ``grpo["output_dir"]``: a path, or ``"latest"`` (its
            newest ``checkpoint-N``), with the optimizer, scheduler and data position.
        overwrite: start afresh in an output folder that already holds a finished model (refused
            otherwise, so a finished run is never overwritten by accident).
        results_path: JSONL file of every evaluation (None: the default store under the cache).
        grpo: GRPOConfig fields (``output_dir``, ``max_steps``, ``num_generations``, ...).
    """

    model: str
    dataset: str = "builtin"
    level: int | None = None
    size: str = "auto"
    split: str | None = None
    backend: str = "triton"
    conversational: bool = True
    one_shot: bool = True
    repeat: int = 1
    exclude: list[str] = field(default_factory=list)
    reward: str = "default"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_devices: str = "auto"
    evaluator: str = "local"
    workers_per_device: int = 1
    eval_preset: str = "rl"
    eval_config: dict[str, Any] = field(default_factory=dict)
    results_path: str | None = None
    lora: dict[str, Any] | None = None
    resume: str | None = None
    overwrite: bool = False
    grpo: dict[str, Any] = field(default_factory=dict)


def build_trainer(cfg: GRPOKernelConfig, *, model: Any = None, processing_class: Any = None) -> tuple[Any, Any]:
    """The ``GRPOTrainer`` and its reward function (close it when done).

    ``model`` / ``processing_class`` override loading ``cfg.model`` (an already built model object).
    """
    from trl import GRPOConfig, GRPOTrainer

    problems = load_problems(cfg.dataset, level=cfg.level, size=cfg.size, split=cfg.split, device=cfg.eval_devices)
    dataset = build_prompt_dataset(problems, backend=cfg.backend,
                                   conversational=cfg.conversational, one_shot=cfg.one_shot, repeat=cfg.repeat,
                                   exclude=cfg.exclude)
    reward_fn = KernelRewardFunction(KernelRewardConfig(
        reward=cfg.reward, reward_kwargs=cfg.reward_kwargs, dataset=problems, devices=cfg.eval_devices,
        workers_per_device=cfg.workers_per_device, eval_config=config_preset(cfg.eval_preset, **cfg.eval_config),
        results_path=cfg.results_path, evaluator=cfg.evaluator))
    grpo = {"output_dir": "kb_gym_grpo", "report_to": [], **_cpu_defaults(), **cfg.grpo}
    try:
        trainer = GRPOTrainer(model=model if model is not None else cfg.model, reward_funcs=[reward_fn],
                              args=GRPOConfig(**grpo), train_dataset=dataset, processing_class=processing_class,
                              peft_config=lora_config(cfg.lora))
    except OSError as exc:
        reward_fn.close()
        raise ModelLoadError(f"cannot load model {cfg.model!r}: {exc}") from exc
    except BaseException:
        reward_fn.close()
        raise
    return trainer, reward_fn


def _cpu_defaults() -> dict[str, Any]:
    """Without a GPU, GRPOConfig's bf16 default refuses to start: train in fp32 on the CPU (smoke runs)."""
    import torch

    return {} if torch.cuda.is_available() else {"use_cpu": True, "bf16": False}


def lora_config(fields: dict[str, Any] | None) -> Any:
    """peft's LoraConfig from plain fields (None: no adapter); a missing peft or a bad field is one ConfigError."""
    if not fields:
        return None
    try:
        from peft import LoraConfig
    except ImportError:
        raise ConfigError("lora (--lora) needs peft: pip install 'kb-gym[lora]'") from None
    check_keys("lora (--lora)", fields, (f.name for f in dataclasses.fields(LoraConfig)))
    try:
        return LoraConfig(**{"task_type": "CAUSAL_LM", **fields})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"lora (--lora): {exc}") from None


def output_dir(cfg: GRPOKernelConfig) -> Path:
    return Path(cfg.grpo.get("output_dir", "kb_gym_grpo"))


def checkpoint_to_resume(cfg: GRPOKernelConfig) -> str | None:
    """The checkpoint ``cfg.resume`` names (``"latest"``: the newest in the output folder), checked to exist;
    else None. A finished model in the output folder without ``resume`` or ``overwrite`` is refused."""
    from transformers.trainer_utils import get_last_checkpoint

    out = output_dir(cfg)
    resume = cfg.resume or cfg.grpo.get("resume_from_checkpoint")
    if resume in (None, False, ""):
        finished = out.is_dir() and any((out / name).exists() for name in ("config.json", "adapter_config.json"))
        if finished and not cfg.overwrite:
            raise ConfigError(f"{out} already holds a trained model: continue it with --resume latest, or start "
                              "afresh with --overwrite")
        return None
    if resume in ("latest", True, "true"):
        last = get_last_checkpoint(str(out)) if out.is_dir() else None
        if last is None:
            raise ConfigError(f"--resume latest: no checkpoint-N folder in {out} (save_steps writes them)")
        return last
    if not Path(str(resume)).is_dir():
        raise ConfigError(f"--resume {resume}: no such checkpoint folder")
    return str(resume)


def train(cfg: GRPOKernelConfig, **kwargs: Any) -> Any:
    """Build the trainer, train (from ``cfg.resume``'s checkpoint where given), save the final model to
    ``output_dir``; returns the trainer."""
    checkpoint = checkpoint_to_resume(cfg)
    trainer, reward_fn = build_trainer(cfg, **kwargs)
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
    finally:
        reward_fn.close()
    return trainer


def config_from_dict(data: dict[str, Any]) -> GRPOKernelConfig:
    """A config from plain data (a JSON file); unknown keys are an error that lists the known ones."""
    check_keys("training", data, (f.name for f in dataclasses.fields(GRPOKernelConfig)))
    if "model" not in data:
        raise ConfigError("the training config needs 'model' (a Hugging Face id or a local path)")
    return GRPOKernelConfig(**data)


def check_config(cfg: GRPOKernelConfig) -> None:
    """Every option's key and value, before a model or an evaluator starts (ConfigError, one line)."""
    if cfg.eval_preset not in CONFIG_PRESETS:
        raise ConfigError(f"eval_preset {cfg.eval_preset!r}: use one of {sorted(CONFIG_PRESETS)}")
    check_eval_config({**CONFIG_PRESETS[cfg.eval_preset], **cfg.eval_config}, "eval_config (--eval)")
    checkpoint_to_resume(cfg)  # a missing checkpoint, or a finished run in the way, before any model loads
    lora_config(cfg.lora)
    if cfg.grpo.get("use_vllm"):
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("grpo use_vllm=true needs vLLM in this environment (pip install vllm); "
                              "or drop it to generate with transformers")
    try:
        evaluator_address(cfg.evaluator)
    except ValueError as exc:
        raise ConfigError(f"evaluator (--evaluator): {exc}") from None
    check_grpo_config({**_cpu_defaults(), **cfg.grpo}, "grpo (--grpo)")
