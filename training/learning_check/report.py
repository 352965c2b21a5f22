"""The learning check's report: before against after GRPO on the held-out problems and, in distribution, on
fresh samples of the train problems (fast_0, fast_1, the share correct with speed credit, mean reward, each with
its intervals, and the paired difference), the GRPO reward curve and the step time split; as ``report.json``,
``report.md`` and ``learning_check.png``.

Written from the other phases' files alone, so it can be rebuilt anywhere from a copied output folder.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kb_gym.training.learning_check.common import (
    Layout,
    LearningCheckConfig,
    PhaseResult,
    config_to_dict,
    fmt,
    read_json,
    read_jsonl,
    write_json,
)
from kb_gym.training.learning_check.grpo import step_rows, timing_summary
from kb_gym.training.learning_check.stats import compare

RATES = ("fast_0", "fast_1", "credited")
METRICS = (*RATES, "mean_reward")
# report key -> (its before and after phases, its title); "before"/"after"/"difference" at the top level are the
# held-out split's, as in reports written before the train split was read
SPLITS = {"test": (("eval-before", "eval-after"), "Held-out problems (test split)"),
          "train": (("eval-before-train", "eval-after-train"), "In distribution (train split, fresh samples)")}


def split_part(report: Mapping[str, Any], split: str) -> dict[str, Any]:
    """``{"before", "after", "difference"}`` of one split (any of them None when not measured)."""
    part = report if split == "test" else (report.get("train") or {})
    return {k: part.get(k) for k in ("before", "after", "difference")}


def _interval(entry: Mapping[str, Any], key: str) -> str:
    lo, hi = entry.get(key) or (math.nan, math.nan)
    return f"[{fmt(lo)}, {fmt(hi)}]"


def markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown tables (what docs/training.md quotes)."""
    lines = ["# Learning check", "", f"Status: {report['status']}.", ""]
    for split, (_, title) in SPLITS.items():
        part = split_part(report, split)
        if part["before"] or part["after"]:
            lines += [f"## {title}", ""]
            _eval_tables(lines, part)
    timing = report.get("grpo_timing")
    if timing and timing.get("steps"):
        lines += [f"GRPO: {timing['steps']} steps.", "", "| part of a step | median s | total s | share |",
                  "|---|---|---|---|"]
        for part in ("generation_s", "evaluation_s", "update_s", "wall_s"):
            e = timing[part]
            lines.append(f"| {part.removesuffix('_s')} | {fmt(e['median'], 2)} | {fmt(e['total'], 1)} | "
                         f"{e['share']:.0%} |")
        lines.append("")
    sft = report.get("sft")
    if sft:
        lines.append(f"SFT: {sft.get('model')} ({sft.get('parameters_m')}M parameters), {sft.get('steps')} steps, "
                     f"loss {fmt(sft.get('first_loss'))} -> {fmt(sft.get('last_loss'))}, "
                     f"{fmt(sft.get('train_seconds'), 0)} s.")
    return "\n".join(lines) + "\n"


def _eval_tables(lines: list[str], part: Mapping[str, Any]) -> None:
    """One split's before/after table, what each run was, and the paired difference."""
    evals = {k: part[k] for k in ("before", "after") if part.get(k)}
    lines += ["| metric | run | value | samples-independent 95% | problem-bootstrap 95% |", "|---|---|---|---|---|"]
    for name in METRICS:
        for which, ev in evals.items():
            e = ev["metrics"][name]
            kind = "bootstrap" if name == "mean_reward" else "wilson"
            lines.append(f"| {name} | {which} | {fmt(e['value'])} | {_interval(e, kind)} ({kind}) | "
                         f"{_interval(e, 'problem_bootstrap')} |")
    lines.append("")
    for which, ev in evals.items():
        m = ev["metrics"]
        lines.append(f"- {which}: {m['samples']} samples on {m['problems']} problems ({ev['model']}, "
                     f"temperature {ev.get('temperature')}); statuses "
                     + ", ".join(f"{k} {v}" for k, v in m["statuses"].items())
                     + f"; generation {fmt(ev.get('generation_seconds'), 0)} s, evaluation "
                     f"{fmt(ev.get('evaluation_seconds'), 0)} s ({ev.get('evaluations')} distinct programs "
                     f"evaluated, {ev.get('duplicates')} duplicates)")
    lines.append("")
    if part.get("difference"):
        lines += ["| after - before | value | paired problem-bootstrap 95% |", "|---|---|---|"]
        for name in METRICS:
            d = part["difference"][name]
            lines.append(f"| {name} | {fmt(d['value'])} | {_interval(d, 'problem_bootstrap')} |")
        lines.append("")


def plot(report: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Four panels: the rates before/after of each split measured (Wilson bars), the mean reward likewise
    (bootstrap bars), the GRPO reward and correct share per step, and each step's time split."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 8), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    runs = [(f"{split} {which}", part[which]) for split in SPLITS for which in ("before", "after")
            if (part := split_part(report, split))[which]]
    width = 0.8 / max(1, len(runs))
    ax = axes[0][0]
    for i, (label, ev) in enumerate(runs):
        xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(RATES))]
        vals = [ev["metrics"][r]["value"] for r in RATES]
        errs = [[v - ev["metrics"][r]["wilson"][0] for r, v in zip(RATES, vals, strict=True)],
                [ev["metrics"][r]["wilson"][1] - v for r, v in zip(RATES, vals, strict=True)]]
        ax.bar(xs, vals, width, yerr=errs, capsize=4, label=f"{label} (n={ev['metrics']['samples']})")
    ax.set_xticks(range(len(RATES)), list(RATES))
    ax.set_ylim(0, 1)
    ax.set_title("rates by split, before/after GRPO (95% Wilson)")
    if runs:
        ax.legend()
    ax = axes[0][1]
    for i, (_, ev) in enumerate(runs):
        e = ev["metrics"]["mean_reward"]
        ax.bar([i], [e["value"]], 0.6, yerr=[[e["value"] - e["bootstrap"][0]], [e["bootstrap"][1] - e["value"]]],
               capsize=6)
    ax.set_xticks(range(len(runs)), [label for label, _ in runs])
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_ylim(-1.05, 1.05)
    ax.set_title("mean reward by split (95% bootstrap)")
    ax = axes[1][0]
    xs = [r["step"] for r in steps]
    if steps:
        ax.plot(xs, [r.get("reward", math.nan) for r in steps], marker="o", label="mean reward")
        ax.plot(xs, [r.get("correct", math.nan) for r in steps], marker="s", linestyle="--", label="correct share")
        ax.legend()
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("GRPO step")
    ax.set_title("GRPO on the train split (per step)")
    ax = axes[1][1]
    bottom = [0.0] * len(steps)
    for part in ("generation_s", "evaluation_s", "update_s"):
        vals = [float(r.get(part, 0.0)) for r in steps]
        ax.bar(xs, vals, bottom=bottom, label=part.removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    if steps:
        ax.legend()
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("seconds")
    ax.set_title("step time split")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def build_report(cfg: LearningCheckConfig, layout: Layout) -> dict[str, Any]:
    from kb_gym.rewards import get_reward

    reward = get_reward(cfg.reward)
    wanted = [*(SPLITS["test"][0] if cfg.samples > 0 else ()), "grpo", *(SPLITS["train"][0] if cfg.train_samples > 0
                                                                            else ())]
    missing = [p for p in wanted if not read_json(layout.done_file(p))]
    report: dict[str, Any] = {"status": "complete" if not missing else "partial (missing: " + ", ".join(missing) + ")",
                              "sft": read_json(layout.done_file("sft")), "config": config_to_dict(cfg)}
    for split, ((before_phase, after_phase), _) in SPLITS.items():
        part: dict[str, Any] = {"before": read_json(layout.done_file(before_phase)),
                                "after": read_json(layout.done_file(after_phase)), "difference": None}
        if part["before"] and part["after"]:
            rows = [[r for r in read_jsonl(layout.phase_dir(p) / "results.jsonl") if "problem_key" in r]
                    for p in (before_phase, after_phase)]
            part["difference"] = compare(*rows, lambda r: float(reward(r)[0]), seed=cfg.seed)
        if split == "test":
            report.update(part)
        else:
            report[split] = part
    steps = step_rows(layout.grpo_steps)
    report["grpo_timing"] = timing_summary(steps)
    report["grpo_steps"] = steps
    return report


def run_report(cfg: LearningCheckConfig, layout: Layout) -> PhaseResult:
    """Write the report from the finished phases (a partial one, said so, while some are missing)."""
    done = read_json(layout.done_file("report"))
    if done:
        return PhaseResult("report", "skipped", [("report", done["markdown"]), ("plot", done["plot"])])
    report = build_report(cfg, layout)
    layout.report.mkdir(parents=True, exist_ok=True)
    write_json(layout.report / "report.json", report)
    md = layout.report / "report.md"
    md.write_text(markdown(report), encoding="utf-8")
    png = plot(report, report["grpo_steps"], layout.report / "learning_check.png")
    rows = [("status", report["status"]), ("report", str(md)), ("plot", str(png))]
    for split in SPLITS:
        part = split_part(report, split)
        for name in METRICS:
            cells = [f"{which} {fmt(part[which]['metrics'][name]['value'])}" for which in ("before", "after")
                     if part[which]]
            if part["difference"]:
                d = part["difference"][name]
                cells.append(f"after-before {fmt(d['value'])} {_interval(d, 'problem_bootstrap')}")
            if cells or split == "test":
                rows.append((f"{name} ({split})", ", ".join(cells) or "-"))
    if report["status"] == "complete":
        write_json(layout.done_file("report"), {"markdown": str(md), "plot": str(png)})
        return PhaseResult("report", "done", rows)
    return PhaseResult("report", "stopped", rows)
