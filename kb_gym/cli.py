"""``kb-gym``: the command line. Subcommands: demo, list, eval, baseline, report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kb_gym.problems import SIZE_CHOICES, SPLITS, Problem, ProblemError, get_problem, load_problems


def _add_dataset(p: argparse.ArgumentParser, default: str | None = "builtin", *, split: bool = True) -> None:
    """``--dataset``, ``--size`` and (where a list of problems is worked through) ``--split``."""
    p.add_argument("--dataset", default=default,
                   help="official | builtin | synthetic[:N[:SEED]] | a folder of problem files | a .jsonl/.parquet "
                        f"file (default: {default or 'builtin'})")
    p.add_argument("--size", default="auto", choices=SIZE_CHOICES,
                   help="problem size: cpu, gpu, or auto (gpu when every --device is a CUDA GPU); the official set "
                        "has its GPU size only (default: auto)")
    if split:
        p.add_argument("--split", default=None, choices=SPLITS,
                       help="only the train or the test split (docs/problems.md); the official set is all test "
                            "(default: every problem)")


class _LoadedProblems(list):
    """Problems the CLI loaded with --size/--split, handed on as a dataset; prints as its spec."""

    def __init__(self, problems: list[Problem], spec: str) -> None:
        super().__init__(problems)
        self.spec = spec

    def __repr__(self) -> str:
        return self.spec

    __str__ = __repr__


def _load(args: argparse.Namespace, dataset: str | None = None, level: int | None = None,
          device: str | None = None) -> list[Problem]:
    """The problems ``args`` name: --dataset (or ``dataset``), --level, --size, --split; ``size auto``
    follows the evaluator's devices (--device, or ``device``)."""
    dataset = dataset or args.dataset or "builtin"
    split = getattr(args, "split", None)
    problems = load_problems(dataset, level, size=args.size, split=split,
                             device=device or getattr(args, "device", None) or "auto")
    spec = f"{dataset} (size={args.size}" + (f", split={split})" if split else ")")
    return _LoadedProblems(problems, spec)


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto (GPU if present, else CPU), cpu, cuda, cuda:N")


def _pick(problems: list[Problem], spec: str) -> Problem:
    """``LEVEL/ID`` (``2/17``), ``levelN/NAME`` or a bare name."""
    level_part, _, rest = spec.rpartition("/")
    level = int(level_part.removeprefix("level")) if level_part.removeprefix("level").isdigit() else None
    if rest.isdigit():
        return get_problem(problems, problem_id=int(rest), level=level)
    return get_problem(problems, name=rest, level=level)


def cmd_list(args: argparse.Namespace) -> int:
    problems = _load(args, level=args.level)
    for p in problems:
        print(f"{p.key}")
    print(f"{len(problems)} problems")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from kb_gym.evaluator import Evaluator

    problem = _pick(_load(args), args.problem)
    text = Path(args.candidate).read_text(encoding="utf-8", errors="replace")
    overrides = {"baseline": args.baseline, "precision": args.precision, "tolerance": args.tolerance}
    with Evaluator(args.device, results_path=args.results, **overrides) as ev:
        result = ev.evaluate(problem, text)
    print(f"problem:  {problem.key}")
    print(f"status:   {result.status}")
    if result.speedup is not None:
        print(f"speedup:  {result.speedup:.3f}x  (candidate {result.runtime_ms:.4g} ms, "
              f"{result.baseline} baseline {result.ref_runtime_ms:.4g} ms)")
    if result.flags:
        print(f"flags:    {', '.join(result.flags)}")
    print("feedback:\n" + result.feedback)
    if args.json:
        print(result.to_json())
    return 0 if result.status == "correct" else 1


def cmd_baseline(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from kb_gym.evaluator import Evaluator

    problems = _load(args, level=args.level)
    failures = 0
    with Evaluator(args.device, results_path=False, baseline=args.baseline) as ev:
        for problem in tqdm(problems, desc=f"baselines ({args.baseline})"):
            r = ev.evaluate_reference(problem)
            if r.ref_runtime_ms is None:
                failures += 1
                tqdm.write(f"{problem.key}: {r.status}: {(r.error or '')[:200]}")
            elif args.verbose:
                tqdm.write(f"{problem.key}: {r.ref_runtime_ms:.4g} ms")
    print(f"cached {len(problems) - failures}/{len(problems)} baselines in {ev.baselines.path}")
    return 1 if failures else 0


def cmd_report(args: argparse.Namespace) -> int:
    from kb_gym.report import report

    ks = [int(k) for k in args.k.split(",") if k.strip()] if args.k else []
    print(report(args.results, png_path=args.png, ks=ks))  # its last line says where the plot went
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    from kb_gym.device_timeline import overlap_report, timelines
    from kb_gym.metrics import load_results

    rows = [row for path in args.results for row in load_results(path)]
    print(overlap_report(rows))
    # exit 1 when two timings shared a GPU (a CPU's workers may time side by side where no lock was asked for)
    return int(any(line.overlaps for key, line in timelines(rows).items() if not key.endswith("/cpu")))


def cmd_demo(args: argparse.Namespace) -> int:
    from kb_gym.demo import run_demo

    return run_demo(device=args.device, dataset=_load(args))


def cmd_bench(args: argparse.Namespace) -> int:
    if args.merge:
        import json

        from kb_gym.batch_report import format_batch, merge_parts

        try:
            report = merge_parts(args.merge)
        except (OSError, ValueError, KeyError) as exc:  # a missing file, bad JSON, parts of different batches
            raise SystemExit(f"kb-gym bench --merge: {exc}") from None
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        print(format_batch(report))
        return 0
    if args.batch:
        from kb_gym.batch_bench import run_batch
        from kb_gym.batch_report import format_batch
        from kb_gym.problems.sizes import size_for_devices

        size = size_for_devices(args.device) if args.size == "auto" else args.size
        part = None
        if args.part:
            i, _, n = args.part.partition("/")
            if not (i.isdigit() and n.isdigit()):
                raise SystemExit(f"--part takes I/N, e.g. 2/4; got {args.part!r}")
            part = (int(i), int(n))
        report = run_batch(device=args.device, size=size, problems=args.problems,
                           kernelbench_way_too=not args.no_kernelbench_way, out=args.out, backend=args.backend,
                           workers_per_device=args.workers_per_device, part=part, warm_builds=args.warm_builds)
        print(format_batch(report))
        return 0
    if args.fidelity:
        import json

        from kb_gym.fidelity import format_fidelity, run_fidelity

        device = "cuda:0" if args.device == "auto" else args.device
        fidelity = run_fidelity(device=device, repeats=args.repeats, presets=tuple(args.presets.split(",")))
        if args.out:
            Path(args.out).write_text(json.dumps(fidelity, indent=1, default=str))
        print(format_fidelity(fidelity))
        return 0 if all(r["status"] == "correct" for r in fidelity["rows"]) else 1
    from kb_gym.bench import format_report, run_bench

    report = run_bench(dataset=_load(args), device=args.device, out=args.out, repeats=args.repeats)
    print(format_report(report))
    return 0 if all(r["status"] == "correct" for r in report["self_check"] + report["fast"]) else 1


def cmd_audit(args: argparse.Namespace) -> int:
    from kb_gym.audit import TRIVIAL, format_audit, run_audit

    kinds = tuple(args.kinds.split(",")) if args.kinds else tuple(TRIVIAL)
    unknown = [k for k in kinds if k not in TRIVIAL]
    if unknown:
        print(f"kb-gym audit: unknown candidate(s) {', '.join(unknown)}; known: {', '.join(TRIVIAL)}", file=sys.stderr)
        return 2
    rows = run_audit(dataset=_load(args, level=args.level), level=args.level, device=args.device, trials=args.trials,
                     kinds=kinds, out=args.out)
    print(format_audit(rows, kinds))
    return 0


def _key_values(pairs: list[str], what: str) -> dict:
    """``--what KEY=VALUE`` options as a dict (config.parse_key_values); a malformed one ends the command."""
    from kb_gym.config import parse_key_values

    try:
        return parse_key_values(pairs, f"--{what}")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def cmd_train(args: argparse.Namespace) -> int:
    import json

    from kb_gym.training.errors import ConfigError, ModelLoadError
    from kb_gym.training.grpo import check_config, config_from_dict, train

    data = json.loads(Path(args.config).read_text()) if args.config else {}
    for name in ("model", "dataset", "level", "reward", "backend"):
        if getattr(args, name) is not None:
            data[name] = getattr(args, name)
    if args.device is not None:
        data["eval_devices"] = args.device
    if args.evaluator is not None:
        data["evaluator"] = args.evaluator
    for name in ("resume", "eval_preset"):
        if getattr(args, name) is not None:
            data[name] = getattr(args, name)
    if args.overwrite:
        data["overwrite"] = True
    if args.lora:
        data["lora"] = {**(data.get("lora") or {}), **_key_values(args.lora, "lora")}
    if args.size != "auto" or args.split is not None:  # else the trainer loads the dataset itself, as before
        data["dataset"] = _load(args, data.get("dataset"), data.get("level"), data.get("eval_devices"))
    if args.plain_prompts:
        data["conversational"] = False
    if args.workers_per_device is not None:
        data["workers_per_device"] = args.workers_per_device
    data["grpo"] = {**data.get("grpo", {}), **_key_values(args.grpo, "grpo")}
    data["eval_config"] = {**data.get("eval_config", {}), **_key_values(args.eval, "eval")}
    if args.exclude_audit:
        from kb_gym.audit import passable_problems

        data["exclude"] = sorted(set(data.get("exclude", [])) | set(passable_problems(args.exclude_audit)))
    try:
        cfg = config_from_dict(data)
        check_config(cfg)
    except ConfigError as exc:  # a typo is one line and exit code 2, before any model loads
        print(f"kb-gym train: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"kb-gym train: {exc}") from None
    try:
        trainer = train(cfg)
    except ModelLoadError as exc:  # one line, not a traceback
        raise SystemExit(f"kb-gym train: {exc}") from None
    print(f"trained {trainer.state.global_step} step(s); model saved to {trainer.args.output_dir}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Start (or stop, or describe) the Ray evaluation service every trainer rank submits to."""
    from kb_gym.service import NAMESPACE, require_ray, start_service, stop_service

    ray = require_ray()
    ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False)
    if args.stop:
        print("stopped" if stop_service(args.name) else f"no service named {args.name!r}")
        return 0
    try:
        service = ray.get_actor(args.name, namespace=NAMESPACE)
    except ValueError:
        if args.status:
            print(f"no service named {args.name!r}")
            return 1
        from kb_gym.config import config_preset

        cfg = config_preset(args.config, **_key_values(args.eval, "eval"))
        service = start_service(args.workers, cfg, results_path=args.results, name=args.name,
                                gpus_per_worker=args.gpus_per_worker)
    workers = ray.get(service.ready.remote())
    print(f"kb_gym evaluation service {args.name!r} on {ray.get_runtime_context().gcs_address}: {len(workers)} "
          f"worker(s) on {sorted({w['device'] for w in workers})}; stats {ray.get(service.stats.remote())}")
    print("trainer ranks: kb-gym train --evaluator ray ... (RAY_ADDRESS set), or RayEvaluator(address=...)")
    return 0


def cmd_evaluate_model(args: argparse.Namespace) -> int:
    from kb_gym.report import format_table
    from kb_gym.training.config_check import check_eval_config
    from kb_gym.training.errors import ConfigError, ModelLoadError
    from kb_gym.training.evaluate_model import ModelEvalConfig, evaluate_model

    try:
        check_eval_config(_key_values(args.eval, "eval"))
    except ConfigError as exc:
        print(f"kb-gym evaluate-model: {exc}", file=sys.stderr)
        return 2

    dataset = _load(args, level=args.level) if args.size != "auto" or args.split is not None else args.dataset
    cfg = ModelEvalConfig(model=args.model, dataset=dataset, level=args.level, backend=args.backend,
                          samples=args.samples, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                          batch_size=args.batch_size, eval_devices=args.device,
                          eval_config=_key_values(args.eval, "eval"), out_dir=args.out, vllm=args.vllm)
    try:
        summary = evaluate_model(cfg)
    except (ModelLoadError, ValueError) as exc:  # a model that will not load, a folder of another model's run
        raise SystemExit(f"kb-gym evaluate-model: {exc}") from None
    print(format_table(summary))
    print(f"results, summary.json, summary.csv and fast_p.png in {args.out}")
    return 0


def cmd_soak(args: argparse.Namespace) -> int:
    from kb_gym.soak import format_soak, run_soak

    stats = run_soak(n=args.n, fault_rate=args.fault_rate, device=args.device, max_minutes=args.max_minutes,
                     out=args.out, workers_per_device=args.workers_per_device)
    print(format_soak(stats))
    return 0 if stats["evaluator_exceptions"] == 0 and stats["lost_results"] == 0 else 1


def cmd_learning_check(args: argparse.Namespace) -> int:
    from kb_gym.training.learning_check import main as learning_check

    return learning_check(args.options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kb-gym", description="kb_gym: KernelBench-style kernel environments "
                                     "and a trustworthy evaluator.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="evaluate known candidates on built-in problems and print a table")
    _add_dataset(p, split=False)
    _add_device(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("list", help="list the problems of a dataset")
    _add_dataset(p)
    p.add_argument("--level", type=int, choices=(1, 2, 3))
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("eval", help="evaluate one candidate file (raw source or an LLM completion)")
    p.add_argument("candidate", help="path to the candidate (.py or a text completion)")
    p.add_argument("--problem", required=True, help="LEVEL/ID (e.g. 2/17) or levelN/NAME")
    _add_dataset(p, split=False)
    _add_device(p)
    p.add_argument("--baseline", default="eager", choices=("eager", "compile"))
    p.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "bf16"))
    p.add_argument("--tolerance", default="default", choices=("default", "kernelbench-v0.1"))
    p.add_argument("--results", default=None, help="JSONL file to append the result to")
    p.add_argument("--json", action="store_true", help="also print the full result as JSON")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("baseline", help="time the baselines of a dataset and fill the baseline cache")
    _add_dataset(p)
    _add_device(p)
    p.add_argument("--level", type=int, choices=(1, 2, 3))
    p.add_argument("--baseline", default="eager", choices=("eager", "compile"))
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("bench", help="the evaluator's own measurements (needs the official problems and a GPU)")
    _add_dataset(p, default="official", split=False)
    _add_device(p)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--fidelity", action="store_true",
                   help="only the fidelity benchmark: our honest kernels, Evaluator time against bare timings")
    p.add_argument("--batch", action="store_true",
                   help="only the throughput batch: 64 mixed candidates through the Evaluator, and the KernelBench way")
    p.add_argument("--no-kernelbench-way", action="store_true", help="with --batch: skip the KernelBench-way run")
    p.add_argument("--problems", type=int, default=16,
                   help="with --batch: how many problems (four candidates each; half built-in, half official)")
    p.add_argument("--part", default=None, metavar="I/N",
                   help="with --batch: only part I of N of the batch (whole problems), both ways; the KernelBench "
                        "way of the whole batch outlasts one 10-minute device call")
    p.add_argument("--warm-builds", action="store_true",
                   help="with --batch: build the CUDA candidates before the clock starts (to compare two runs)")
    p.add_argument("--merge", nargs="+", default=None, metavar="PART_JSON",
                   help="add up the --out reports of the parts of one batch and print the whole batch's table")
    p.add_argument("--workers-per-device", type=int, default=1,
                   help="with --batch (local backend): warm workers per device; 2 loads and compiles the next "
                        "candidate while one measures")
    p.add_argument("--backend", default="local", choices=("local", "ray"),
                   help="with --batch: evaluate through a local Evaluator or the Ray service (kb-gym[ray])")
    p.add_argument("--presets", default="default",
                   help="with --fidelity: comma-separated EvalConfig presets to compare, e.g. default,rl")
    p.add_argument("--out", default=None, help="write the full report as JSON here")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("audit", help="which problems trivial candidates (zeros, the input, a constant, another "
                                     "input's answer, bf16, fp16) pass; the reference and its float64 run as "
                                     "controls")
    _add_dataset(p, default="official")
    _add_device(p)
    p.add_argument("--level", type=int, choices=(1, 2, 3))
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--kinds", default=None, help="comma-separated trivial candidates to run (default: all)")
    p.add_argument("--out", default=None, help="JSONL of rows, appended as each problem finishes; problems "
                                               "already in it are skipped (resume)")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("train", help="GRPO fine-tuning of a Hugging Face causal LM against the evaluator (TRL)")
    p.add_argument("--config", default=None, help="JSON file of GRPOKernelConfig fields (see docs/training.md)")
    p.add_argument("--model", default=None, help="Hugging Face model id or local path")
    _add_dataset(p, default=None)
    p.add_argument("--level", type=int, choices=(1, 2, 3), default=None)
    p.add_argument("--backend", default=None, help="prompt backend: triton or cuda")
    p.add_argument("--reward", default=None, help="reward preset name (default, fast_p, kevin, drkernel)")
    p.add_argument("--device", default=None, help="the evaluator's devices (default: auto)")
    p.add_argument("--grpo", action="append", default=[], metavar="KEY=VALUE",
                   help="a GRPOConfig field, e.g. --grpo max_steps=100 --grpo num_generations=8")
    p.add_argument("--eval", action="append", default=[], metavar="KEY=VALUE",
                   help="an EvalConfig field, e.g. --eval trials=3")
    p.add_argument("--workers-per-device", type=int, default=None,
                   help="the evaluator's warm workers per device (compiles overlap, kernels take turns)")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CHECKPOINT",
                   help="continue from a checkpoint (default: the newest checkpoint-N in output_dir), with the "
                        "optimizer, scheduler and data position")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in an output_dir that holds a finished model (refused otherwise)")
    p.add_argument("--lora", action="append", default=[], metavar="KEY=VALUE",
                   help="train a LoRA adapter: peft LoraConfig fields, e.g. --lora r=16 "
                        "--lora target_modules=all-linear")
    p.add_argument("--eval-preset", default=None, choices=("rl", "default"),
                   help="the EvalConfig preset of training evaluations (default: rl)")
    p.add_argument("--evaluator", default=None, metavar="local|ray|ray://HOST:PORT",
                   help="evaluate in this process (local, the default) or on the Ray service of `kb-gym serve`")
    p.add_argument("--plain-prompts", action="store_true",
                   help="string prompts instead of chat messages (base models without a chat template)")
    p.add_argument("--exclude-audit", default=None, metavar="AUDIT.jsonl",
                   help="leave out the problems this kb-gym audit found a trivial output passes")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("serve", help="start the Ray evaluation service every trainer rank shares (kb-gym[ray])")
    p.add_argument("--address", default="auto", help="the Ray cluster (auto: the one this node belongs to)")
    p.add_argument("--name", default="kb_gym_evaluation", help="the service's name (clients connect by it)")
    p.add_argument("--workers", type=int, default=None, help="evaluation workers (default: one per cluster GPU)")
    p.add_argument("--gpus-per-worker", type=float, default=None, help="GPUs each worker holds (default 1)")
    p.add_argument("--config", default="default", help="EvalConfig preset of requests that bring none")
    p.add_argument("--eval", action="append", default=[], metavar="KEY=VALUE", help="an EvalConfig field")
    p.add_argument("--results", default=None, help="JSONL results store the service appends every result to")
    p.add_argument("--status", action="store_true", help="describe the running service, start nothing")
    p.add_argument("--stop", action="store_true", help="stop the service")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("evaluate-model", help="generate answers with a checkpoint, evaluate them, write fast_p")
    p.add_argument("--model", required=True, help="Hugging Face model id or local path")
    _add_dataset(p)
    p.add_argument("--level", type=int, choices=(1, 2, 3), default=None)
    p.add_argument("--backend", default="triton", help="prompt backend: triton or cuda")
    p.add_argument("--samples", type=int, default=1, help="answers per problem")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--max-new-tokens", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=8, help="prompts per generate call")
    _add_device(p)
    p.add_argument("--eval", action="append", default=[], metavar="KEY=VALUE", help="an EvalConfig field")
    p.add_argument("--out", default="kb_gym_eval", help="output folder")
    p.add_argument("--vllm", action="store_true", help="generate with vLLM (where installed) instead of transformers")
    p.set_defaults(func=cmd_evaluate_model)

    # every option is the learning check's own (kb-gym learning-check --help): handed on untouched
    p = sub.add_parser("learning-check", add_help=False, prefix_chars="+",
                       help="SFT then GRPO against the evaluator, fast_p before/after (docs/training.md)")
    p.add_argument("options", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_learning_check)

    p = sub.add_parser("soak", help="many evaluations mixing faulty and honest candidates; memory and losses")
    _add_device(p)
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("--fault-rate", type=float, default=0.2)
    p.add_argument("--max-minutes", type=float, default=60.0)
    p.add_argument("--workers-per-device", type=int, default=1,
                   help="warm workers per device; they load side by side and take turns on the device")
    p.add_argument("--out", default=None, help="write the statistics as JSON here")
    p.set_defaults(func=cmd_soak)

    p = sub.add_parser("timeline", help="per device, the timings of results files and any two that overlapped "
                                        "(exit 1 when two shared a GPU)")
    p.add_argument("results", nargs="+", help="results JSONL file(s), e.g. of several trainer ranks")
    p.set_defaults(func=cmd_timeline)

    p = sub.add_parser("report", help="fast_p table (p = 0 ... 2, by level) of a results file, or several compared")
    p.add_argument("results", nargs="+", help="results JSONL file(s): several give one table and one plot of all")
    p.add_argument("--k", default=None, help="comma-separated k for fast_1@k columns (unbiased pass@k), e.g. 1,4")
    p.add_argument("--png", default=None, help="write a fast_p-vs-p plot here")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ProblemError as exc:
        print(f"kb-gym: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"kb-gym: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
