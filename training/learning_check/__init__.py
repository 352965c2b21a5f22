"""The learning check (issue 14): a small model supervised on a generated corpus, then GRPO against the real
evaluator, evaluated on held-out problems before and after. ``phases`` runs it; the other modules are its
parts: the corpus, the model and tokenizer, SFT, GRPO, the evaluations, the statistics and the report."""

from kb_gym.training.learning_check.phases import main, parse_phases, run

__all__ = ["main", "parse_phases", "run"]
