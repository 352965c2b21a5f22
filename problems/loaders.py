"""Loaders: every dataset source named in DESIGN.md -> list[Problem].

Sources: ``"official"`` (KB_GYM_DATASET, else the Hugging Face dataset), ``"builtin"``,
``"synthetic"`` / ``"synthetic:N"`` / ``"synthetic:N:SEED"`` (generated, see synthetic.py), a folder of
problem files (flat or ``level1/ level2/ level3/``), a folder of ``level_N.jsonl``/``.parquet``
files, one ``.jsonl`` or ``.parquet`` file in the Hugging Face schema, or a list of Problems.

Sizes (``size=``) and splits (``split=``) are described in docs/problems.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from kb_gym.problems.problem import Problem, ProblemError, check_problem_code, id_from_name
from kb_gym.problems.sizes import SIZES, check_size, size_annotations, size_for_devices, sized_code

HF_DATASET = "ScalingIntelligence/KernelBench"
HF_COLUMNS = ("code", "level", "name", "problem_id")
DATASET_ENV = "KB_GYM_DATASET"
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
NAMED_DATASETS = ("official", "builtin", "synthetic")
SPLITS = ("train", "test")
TEST_SHARE = 0.2
"""The share of a set's problems (by key hash) in the ``"test"`` split."""
MIN_LEVEL_FOR_TEST = 5
"""A level with at least this many problems always has a test problem (see :func:`assign_splits`)."""

DatasetSpec = str | os.PathLike | Sequence[Problem]


def load_problems(dataset: DatasetSpec = "official", level: int | None = None, size: str = "auto",
                  split: str | None = None, *, device: str | Sequence[str] | None = None,
                  allow_official_train: bool = False) -> list[Problem]:
    """Load problems from ``dataset``, keeping only ``level`` when given, sorted by (level, id).

    ``size``: ``"cpu"``, ``"gpu"`` or ``"auto"``: ``"gpu"`` when every one of ``device`` (the
    devices the problems will run on, as the Evaluator names them) is a CUDA GPU, else ``"cpu"``;
    without ``device``, ``"gpu"`` when torch sees a CUDA GPU. Our problem files (the built-in set,
    a folder of them) are rewritten to that size through their ``# gpu:`` annotations, synthetic
    problems are generated at it; the official set and ``.jsonl``/``.parquet`` files have one size
    (a GPU's): ``"auto"`` and ``"gpu"`` take them as they are, ``"cpu"`` is an error. Each Problem's
    ``size`` field says what it got.

    ``split``: ``None`` (everything), ``"train"`` or ``"test"``, by :func:`assign_splits`. The
    official set is for evaluation only: ``split="test"`` returns all of it and ``split="train"`` is
    an error unless ``allow_official_train=True``.

    Raises ProblemError with a message that says what was expected for unknown names, missing
    paths, files without the needed columns and problem files without Model/get_inputs/...
    """
    if level is not None and level not in (1, 2, 3):
        raise ProblemError(f"level must be 1, 2 or 3 (or None for all), got {level!r}")
    check_size(size)
    if split is not None and split not in SPLITS:
        raise ProblemError(f"split must be 'train', 'test' or None (everything), got {split!r}")
    official = isinstance(dataset, str) and dataset == "official"
    if official and split == "train" and not allow_official_train:
        raise ProblemError(
            "split='train' on the official KernelBench set: it is the evaluation set (all of it is the test "
            "split), and a policy trained on the problems it is then scored on reports an inflated fast_p. "
            "Train on dataset='builtin' or 'synthetic' (split='train'), or pass allow_official_train=True "
            "to load_problems or the env if you mean to.")
    problems = _load_any(dataset, level, size, device)
    if level is not None:
        problems = [p for p in problems if p.level == level]
    problems.sort(key=lambda p: (p.level, p.id, p.name))
    _check_unique(problems)
    if split is not None and not official:
        problems = select_split(problems, split)
    return problems


def split_hash(key: str) -> float:
    """A problem key's place in [0, 1): the first 8 bytes of its SHA-256, the same on every machine and
    run (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64


def assign_splits(problems: Sequence[Problem]) -> dict[str, str]:
    """``{key: "train" | "test"}`` for every problem.

    The rule: a problem is ``"test"`` when ``split_hash(key) < TEST_SHARE`` (about 20%), else
    ``"train"``; it depends on the key alone, so adding problems never moves another one. One
    exception keeps small levels testable: a level with at least ``MIN_LEVEL_FOR_TEST`` problems of
    which none hashes into test has its lowest-hash problem moved to test. Once any problem of a level
    hashes into test, that fallback never applies to the level again.
    """
    splits = {p.key: "test" if split_hash(p.key) < TEST_SHARE else "train" for p in problems}
    by_level: dict[int, list[str]] = {}
    for p in problems:
        by_level.setdefault(p.level, []).append(p.key)
    for keys in by_level.values():
        if len(keys) >= MIN_LEVEL_FOR_TEST and all(splits[k] == "train" for k in keys):
            splits[min(keys, key=split_hash)] = "test"
    return splits


def select_split(problems: Sequence[Problem], split: str) -> list[Problem]:
    """The problems of ``split`` (``"train"`` or ``"test"``) by :func:`assign_splits`, order kept."""
    if split not in SPLITS:
        raise ProblemError(f"split must be 'train' or 'test', got {split!r}")
    splits = assign_splits(problems)
    return [p for p in problems if splits[p.key] == split]


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


def _resolve(size: str, device: str | Sequence[str] | None) -> str:
    return size_for_devices(device) if size == "auto" else size


def _one_size(size: str, what: str) -> None:
    if size == "cpu":
        raise ProblemError(
            f"size='cpu' asked for, but {what} have one size, written for a GPU (they carry no '# gpu:' "
            "annotations to shrink them by); use size='auto' or 'gpu', or dataset='builtin' or 'synthetic', "
            "which have CPU sizes")


def _load_any(dataset: DatasetSpec, level: int | None, size: str, device: str | Sequence[str] | None
              ) -> list[Problem]:
    if isinstance(dataset, (list, tuple)):
        return _from_list(dataset, size, device)
    if isinstance(dataset, str) and dataset in NAMED_DATASETS:
        if dataset == "builtin":
            return _from_folder(BUILTIN_DIR, level, _resolve(size, device), label_all=True)
        if dataset == "official":
            _one_size(size, "the official KernelBench problems")
            return [dataclasses.replace(p, size="gpu") for p in _load_official(level)]
    if isinstance(dataset, str) and dataset.split(":")[0] == "synthetic":
        return _synthetic(dataset, level, _resolve(size, device))
    if isinstance(dataset, (str, os.PathLike)):
        path = Path(dataset).expanduser()
        if not path.exists():
            raise ProblemError(
                f"dataset {str(dataset)!r} is neither a known name ({', '.join(NAMED_DATASETS)}) "
                "nor an existing path (a folder of problem files, or a .jsonl/.parquet file)")
        return _from_path(path, level, size, device)
    raise ProblemError(f"dataset must be a name, a path or a list of Problems, got {type(dataset).__name__}")


def _synthetic(dataset: str, level: int | None, size: str) -> list[Problem]:
    from kb_gym.problems.synthetic import generate_problems, parse_spec

    try:
        n, seed = parse_spec(dataset)
    except ValueError as exc:
        raise ProblemError(str(exc)) from None
    kwargs = {}
    if "size" in inspect.signature(generate_problems).parameters:
        kwargs["size"] = size
    elif size == "gpu":
        raise ProblemError("synthetic problems at size='gpu' need problems/synthetic.py's generate_problems to take "
                           "size=; this copy generates CPU sizes only (use size='cpu')")
    try:
        problems = generate_problems(n, seed, level=level, **kwargs)
    except ValueError as exc:
        raise ProblemError(str(exc)) from None
    return [p if p.size else dataclasses.replace(p, size=size) for p in problems]


def _from_path(path: Path, level: int | None, size: str | None, device: str | Sequence[str] | None = None
               ) -> list[Problem]:
    """``size`` None: take the files as they are (the official set's copy)."""
    if path.is_dir():
        tables = sorted(p for p in path.iterdir() if re.fullmatch(r"level_?[1-3]\.(jsonl|parquet)", p.name))
        if tables:
            if size is not None:
                _one_size(size, f"the problems of {path} (.jsonl/.parquet tables)")
            return [p for table in tables for p in _from_table(table)]
        return _from_folder(path, level, None if size is None else _resolve(size, device))
    if path.suffix in (".jsonl", ".parquet"):
        if size is not None:
            _one_size(size, f"the problems of {path}")
        return _from_table(path)
    raise ProblemError(f"{path}: expected a folder, a .jsonl or a .parquet file")


def _load_official(level: int | None) -> list[Problem]:
    local = os.environ.get(DATASET_ENV)
    if local:
        path = Path(local).expanduser()
        if not path.exists():
            raise ProblemError(f"{DATASET_ENV}={local!r} does not exist")
        return _from_path(path, level, None)
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


def _from_folder(folder: Path, level: int | None, size: str | None, label_all: bool = False) -> list[Problem]:
    # Levels 1-3 only, as everywhere else: a KernelBench checkout also has level4/ (Hugging Face
    # models, other dependencies), which is not part of the benchmark these envs serve.
    level_dirs = sorted(d for d in folder.iterdir() if d.is_dir() and re.fullmatch(r"level[1-3]", d.name))
    if level_dirs:
        return [p for d in level_dirs
                if level is None or int(d.name[-1]) == level
                for p in _files_to_problems(d, int(d.name[-1]), size, label_all)]
    problems = _files_to_problems(folder, level or 0, size, label_all)
    if not problems:
        raise ProblemError(f"{folder}: no problem files (*.py) found, flat or under level1/ level2/ level3/")
    return problems


def _files_to_problems(folder: Path, level: int, size: str | None, label_all: bool) -> list[Problem]:
    """``size`` None: the files as they are; else each file's ``# gpu:`` lines rewritten to it, and the
    Problem labelled with it when the file is annotated (every file when ``label_all``)."""
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
        label = ""
        if size is not None:
            sized = sized_code(code, size, str(path))
            label = size if label_all or sized != code else ""
            code = sized
        problems.append(Problem(id=pid, name=path.stem, level=level, code=code, source=str(path), size=label))
    return problems


def _from_list(items: Sequence[Problem], size: str, device: str | Sequence[str] | None) -> list[Problem]:
    """Problems that know their size pass as they are (an explicit other size is an error); those that
    do not, and carry ``# gpu:`` annotations, are rewritten like files."""
    problems = []
    for item in items:
        if not isinstance(item, Problem):
            raise ProblemError(f"a dataset list must hold Problem objects, got {type(item).__name__}")
        where = item.source or item.name
        check_problem_code(item.code, where)
        if item.size:
            if size in SIZES and item.size != size:
                raise ProblemError(f"{item.key} was loaded at size {item.size!r}, not {size!r}; "
                                   f"load it again with size={size!r}")
        elif size_annotations(item.code, where):
            resolved = _resolve(size, device)
            item = dataclasses.replace(item, code=sized_code(item.code, resolved, where), size=resolved)
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
