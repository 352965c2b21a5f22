"""Loaders: every dataset source named in DESIGN.md -> list[Problem].

Sources: ``"official"`` (KB_GYM_DATASET, else the Hugging Face dataset), ``"builtin"``,
``"synthetic"`` / ``"synthetic:N"`` / ``"synthetic:N:SEED"`` (generated, see synthetic.py), a folder of
problem files (flat or ``level1/ level2/ level3/``), a folder of ``level_N.jsonl``/``.parquet``
files, one ``.jsonl`` or ``.parquet`` file in the Hugging Face schema, or a list of Problems.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from kb_gym.problems.problem import Problem, ProblemError, check_problem_code, id_from_name

HF_DATASET = "ScalingIntelligence/KernelBench"
HF_COLUMNS = ("code", "level", "name", "problem_id")
DATASET_ENV = "KB_GYM_DATASET"
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
NAMED_DATASETS = ("official", "builtin", "synthetic")

DatasetSpec = str | os.PathLike | Sequence[Problem]


def load_problems(dataset: DatasetSpec = "official", level: int | None = None) -> list[Problem]:
    """Load problems from ``dataset``, keeping only ``level`` when given, sorted by (level, id).

    Raises ProblemError with a message that says what was expected for unknown names, missing
    paths, files without the needed columns and problem files without Model/get_inputs/...
    """
    if level is not None and level not in (1, 2, 3):
        raise ProblemError(f"level must be 1, 2 or 3 (or None for all), got {level!r}")
    problems = _load_any(dataset, level)
    if level is not None:
        problems = [p for p in problems if p.level == level]
    problems.sort(key=lambda p: (p.level, p.id, p.name))
    _check_unique(problems)
    return problems


def get_problem(problems: Sequence[Problem], *, problem_id: int | None = None,
                name: str | None = None, level: int | None = None) -> Problem:
    """Pick one problem by id or name (``"19_ReLU"``, ``"19_ReLU.py"`` or ``"level1/19_ReLU"``)."""
    if name is not None:
        if "/" in name:
            head, name = name.split("/", 1)
            level = int(head.removeprefix("level")) if head.removeprefix("level").isdigit() else level
        name = name.removesuffix(".py")
    matches = [p for p in problems
               if (problem_id is None or p.id == problem_id)
               and (name is None or p.name == name)
               and (level is None or p.level == level)]
    if len(matches) == 1:
        return matches[0]
    wanted = f"id={problem_id}" if name is None else f"name={name!r}"
    if not matches:
        raise ProblemError(f"no problem with {wanted}" + (f" at level {level}" if level else "")
                           + f" among {len(problems)} problems")
    raise ProblemError(f"{len(matches)} problems match {wanted}: "
                       f"{', '.join(p.key for p in matches[:5])}; give the level too")


def exclude_problems(problems: Sequence[Problem], exclude: Iterable[str] | None) -> list[Problem]:
    """``problems`` without those named in ``exclude`` (keys like ``"level2/80_Gemm_Max_Subtract_GELU"``).

    Entries that name no problem here are ignored, so one list (say, every problem an audit found
    passable, see ``kb_gym.audit.passable_problems``) serves every level.
    """
    if exclude is None:
        return list(problems)
    if isinstance(exclude, str):
        raise TypeError("exclude takes a list of problem keys, not one string")
    drop = set(exclude)
    return [p for p in problems if p.key not in drop]


def _load_any(dataset: DatasetSpec, level: int | None) -> list[Problem]:
    if isinstance(dataset, (list, tuple)):
        return _from_list(dataset)
    if isinstance(dataset, str) and dataset in NAMED_DATASETS:
        if dataset == "builtin":
            return _from_folder(BUILTIN_DIR, level)
        if dataset == "official":
            return _load_official(level)
    if isinstance(dataset, str) and dataset.split(":")[0] == "synthetic":
        from kb_gym.problems.synthetic import generate_problems, parse_spec

        try:
            n, seed = parse_spec(dataset)
            return generate_problems(n, seed, level=level)
        except ValueError as exc:
            raise ProblemError(str(exc)) from None
    if isinstance(dataset, (str, os.PathLike)):
        path = Path(dataset).expanduser()
        if not path.exists():
            raise ProblemError(
                f"dataset {str(dataset)!r} is neither a known name ({', '.join(NAMED_DATASETS)}) "
                "nor an existing path (a folder of problem files, or a .jsonl/.parquet file)")
        return _from_path(path, level)
    raise ProblemError(f"dataset must be a name, a path or a list of Problems, got {type(dataset).__name__}")


def _from_path(path: Path, level: int | None) -> list[Problem]:
    if path.is_dir():
        tables = sorted(p for p in path.iterdir() if re.fullmatch(r"level_?[1-3]\.(jsonl|parquet)", p.name))
        if tables:
            return [p for table in tables for p in _from_table(table)]
        return _from_folder(path, level)
    if path.suffix == ".jsonl":
        return _from_table(path)
    if path.suffix == ".parquet":
        return _from_table(path)
    raise ProblemError(f"{path}: expected a folder, a .jsonl or a .parquet file")


def _load_official(level: int | None) -> list[Problem]:
    local = os.environ.get(DATASET_ENV)
    if local:
        path = Path(local).expanduser()
        if not path.exists():
            raise ProblemError(f"{DATASET_ENV}={local!r} does not exist")
        return _from_path(path, level)
    try:
        return _from_hugging_face(level)
    except Exception as exc:  # noqa: BLE001 - any hub/network failure gets the same advice
        raise ProblemError(
            f"could not load the official KernelBench problems: {type(exc).__name__}: {exc}\n"
            f"Either set {DATASET_ENV} to a local copy (a KernelBench checkout's KernelBench/ folder, "
            f"or a folder/file of level_N.jsonl / .parquet in the Hugging Face schema), or make the "
            f"Hugging Face dataset {HF_DATASET} reachable (network, or a warm HF cache). "
            "dataset='builtin' works offline.") from None


def _from_hugging_face(level: int | None) -> list[Problem]:
    import datasets

    levels = [level] if level else [1, 2, 3]
    problems: list[Problem] = []
    for lvl in levels:
        split = datasets.load_dataset(HF_DATASET, split=f"level_{lvl}")
        problems.extend(_rows_to_problems(split, f"hf:{HF_DATASET}/level_{lvl}"))
    return problems


def _from_table(path: Path) -> list[Problem]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001
            raise ProblemError(f"{path}: not a readable parquet file ({exc})") from None
        missing = [c for c in HF_COLUMNS if c not in table.column_names]
        if missing:
            raise ProblemError(f"{path}: missing column(s) {', '.join(missing)}; "
                               f"expected the Hugging Face schema {', '.join(HF_COLUMNS)}")
        return _rows_to_problems(table.to_pylist(), str(path))
    rows = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ProblemError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
    return _rows_to_problems(rows, str(path))


def _rows_to_problems(rows: Iterable[dict], where: str) -> list[Problem]:
    problems = []
    for n, row in enumerate(rows, 1):
        missing = [c for c in HF_COLUMNS if c not in row]
        if missing:
            raise ProblemError(f"{where} row {n}: missing field(s) {', '.join(missing)}; "
                               f"expected the Hugging Face schema {', '.join(HF_COLUMNS)}")
        name = str(row["name"]).removesuffix(".py")
        origin = f"{where}#{name}"
        check_problem_code(str(row["code"]), origin)
        problems.append(Problem(id=int(row["problem_id"]), name=name, level=int(row["level"]),
                                code=str(row["code"]), source=origin))
    return problems


def _from_folder(folder: Path, level: int | None) -> list[Problem]:
    # Levels 1-3 only, as everywhere else: a KernelBench checkout also has level4/ (Hugging Face
    # models, other dependencies), which is not part of the benchmark these envs serve.
    level_dirs = sorted(d for d in folder.iterdir() if d.is_dir() and re.fullmatch(r"level[1-3]", d.name))
    if level_dirs:
        return [p for d in level_dirs
                if level is None or int(d.name[-1]) == level
                for p in _files_to_problems(d, int(d.name[-1]))]
    problems = _files_to_problems(folder, level or 0)
    if not problems:
        raise ProblemError(f"{folder}: no problem files (*.py) found, flat or under level1/ level2/ level3/")
    return problems


def _files_to_problems(folder: Path, level: int) -> list[Problem]:
    problems = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            code = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ProblemError(f"{path}: cannot read ({exc})") from None
        check_problem_code(code, str(path))
        pid = id_from_name(path.stem)
        if pid is None:
            raise ProblemError(f"{path}: file name must start with the problem id, e.g. 19_ReLU.py")
        problems.append(Problem(id=pid, name=path.stem, level=level, code=code, source=str(path)))
    return problems


def _from_list(items: Sequence[Problem]) -> list[Problem]:
    problems = []
    for item in items:
        if not isinstance(item, Problem):
            raise ProblemError(f"a dataset list must hold Problem objects, got {type(item).__name__}")
        check_problem_code(item.code, item.source or item.name)
        problems.append(item)
    return problems


def _check_unique(problems: list[Problem]) -> None:
    # Unique (level, name) and unique (level, id): envs and the CLI select a problem by id within a
    # level, so two problems sharing one would make that selection ambiguous.
    seen: dict[str, str] = {}
    seen_ids: dict[tuple[int, int], Problem] = {}
    for p in problems:
        if p.key in seen:
            raise ProblemError(f"duplicate problem {p.key}: {seen[p.key]} and {p.source}")
        seen[p.key] = p.source
        other = seen_ids.setdefault((p.level, p.id), p)
        if other is not p:
            raise ProblemError(f"duplicate problem id {p.id} at level {p.level}: {other.name} "
                               f"({other.source}) and {p.name} ({p.source})")
