"""The learning check's report: before against after GRPO on the held-out problems (fast_0, fast_1, the share
correct with speed credit, mean reward, each with its intervals, and the paired difference), the GRPO reward
curve and the step time split; as ``report.json``, ``report.md`` and ``learning_check.png``.

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


def _interval(entry: Mapping[str, Any], key: str) -> str:
    lo, hi = entry.get(key) or (math.nan, math.nan)
    return f"[{fmt(lo)}, {fmt(hi)}]"


def markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown tables (what docs/training.md quotes)."""
    lines = ["# Learning check", "", f"Status: {report['status']}.", ""]
    evals = {k: report.get(k) for k in ("before", "after")}
    if any(evals.values()):
        lines += ["| metric | run | value | samples-independent 95% | problem-bootstrap 95% |", "|---|---|---|---|---|"]
        for name in METRICS:
            for which, ev in evals.items():
                if not ev:
                    continue
                e = ev["metrics"][name]
                kind = "bootstrap" if name == "mean_reward" else "wilson"
                lines.append(f"| {name} | {which} | {fmt(e['value'])} | {_interval(e, kind)} ({kind}) | "
                             f"{_interval(e, 'problem_bootstrap')} |")
        lines.append("")
        for which, ev in evals.items():
            if ev:
                m = ev["metrics"]
                lines.append(f"- {which}: {m['samples']} samples on {m['problems']} problems ({ev['model']}, "
                             f"temperature {ev.get('temperature')}); statuses "
                             + ", ".join(f"{k} {v}" for k, v in m["statuses"].items())
                             + f"; generation {fmt(ev.get('generation_seconds'), 0)} s, evaluation "
                             f"{fmt(ev.get('evaluation_seconds'), 0)} s ({ev.get('evaluations')} distinct programs "
                             f"evaluated, {ev.get('duplicates')} duplicates)")
        lines.append("")
    if report.get("difference"):
        lines += ["| after - before | value | paired problem-bootstrap 95% |", "|---|---|---|"]
        for name in METRICS:
            d = report["difference"][name]
            lines.append(f"| {name} | {fmt(d['value'])} | {_interval(d, 'problem_bootstrap')} |")
        lines.append("")
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


def plot(report: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Four panels: the rates before/after (Wilson bars), the mean reward before/after (bootstrap bars), the
    GRPO reward and correct share per step, and each step's time split."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 8), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    runs = [(w, report[w]) for w in ("before", "after") if report.get(w)]
    width = 0.38
    ax = axes[0][0]
    for i, (which, ev) in enumerate(runs):
        xs = [j + (i - 0.5) * width for j in range(len(RATES))]
        vals = [ev["metrics"][r]["value"] for r in RATES]
        errs = [[v - ev["metrics"][r]["wilson"][0] for r, v in zip(RATES, vals, strict=True)],
                [ev["metrics"][r]["wilson"][1] - v for r, v in zip(RATES, vals, strict=True)]]
        ax.bar(xs, vals, width, yerr=errs, capsize=4, label=f"{which} (n={ev['metrics']['samples']})")
    ax.set_xticks(range(len(RATES)), list(RATES))
    ax.set_ylim(0, 1)
    ax.set_title("held-out problems: rates (95% Wilson)")
    ax.legend()
    ax = axes[0][1]
    for i, (_, ev) in enumerate(runs):
        e = ev["metrics"]["mean_reward"]
        ax.bar([i], [e["value"]], 0.6, yerr=[[e["value"] - e["bootstrap"][0]], [e["bootstrap"][1] - e["value"]]],
               capsize=6)
    ax.set_xticks(range(len(runs)), [w for w, _ in runs])
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_ylim(-1.05, 1.05)
    ax.set_title("held-out problems: mean reward (95% bootstrap)")
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

    before, after = read_json(layout.done_file("eval-before")), read_json(layout.done_file("eval-after"))
    grpo, sft = read_json(layout.done_file("grpo")), read_json(layout.done_file("sft"))
    missing = [name for name, part in (("eval-before", before), ("grpo", grpo), ("eval-after", after)) if not part]
    report: dict[str, Any] = {"status": "complete" if not missing else "partial (missing: " + ", ".join(missing) + ")",
                              "before": before, "after": after, "sft": sft, "config": config_to_dict(cfg)}
    if before and after:
        reward = get_reward(cfg.reward)
        rows = {w: [r for r in read_jsonl(layout.phase_dir(f"eval-{w}") / "results.jsonl") if "problem_key" in r]
                for w in ("before", "after")}
        report["difference"] = compare(rows["before"], rows["after"], lambda r: float(reward(r)[0]), seed=cfg.seed)
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
    for name in METRICS:
        cells = []
        for which in ("before", "after"):
            if report.get(which):
                cells.append(f"{which} {fmt(report[which]['metrics'][name]['value'])}")
        if report.get("difference"):
            d = report["difference"][name]
            cells.append(f"after-before {fmt(d['value'])} {_interval(d, 'problem_bootstrap')}")
        rows.append((name, ", ".join(cells) or "-"))
    if report["status"] == "complete":
        write_json(layout.done_file("report"), {"markdown": str(md), "plot": str(png)})
        return PhaseResult("report", "done", rows)
    return PhaseResult("report", "stopped", rows)
