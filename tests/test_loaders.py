"""The problem loaders: every dataset source, the selectors, and a clear ProblemError for bad input."""

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kb_gym.problems.loaders as loaders
from kb_gym.cli import main
from kb_gym.problems import (
    BUILTIN_DIR,
    Problem,
    ProblemError,
    assign_splits,
    check_problem_code,
    get_problem,
    load_problems,
    select_split,
    sized_code,
    split_hash,
)

BUILTIN_NAMES = {
    1: ["1_ReLU", "2_GELUTanh", "3_RowSoftmax", "4_SmallMatmul", "5_RowSum", "6_LayerNormNoAffine",
        "7_ScaleAdd", "8_EmbeddingLookup"],
    2: ["1_LinearBiasReLUScale", "2_Conv2dReLUChannelBias", "3_MatmulGELUResidual",
        "4_LayerNormResidualTanh", "5_LinearSiLUCenterGate", "6_Conv2dMaxPoolHardtanhSum"],
    3: ["1_ThreeLayerMLP", "2_TinyTransformerBlock", "3_TinyCNN", "4_ResidualConvStack"],
}


def problem_code(doc: str = "identity") -> str:
    return (
        "import torch\nimport torch.nn as nn\n\n\n"
        f"class Model(nn.Module):\n    \"\"\"{doc}\"\"\"\n\n"
        "    def forward(self, x):\n        return x\n\n\n"
        "def get_inputs():\n    return [torch.randn(4, 4)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )


def write_problem(folder: Path, name: str, code: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(problem_code(name) if code is None else code, encoding="utf-8")
    return path


def hf_row(pid: int, name: str, level: int, code: str | None = None) -> dict:
    return {"code": problem_code(name) if code is None else code, "level": level, "name": name,
            "problem_id": pid}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def error_of(*args, **kwargs) -> str:
    with pytest.raises(ProblemError) as info:
        load_problems(*args, **kwargs)
    return str(info.value)


# --- the built-in set -------------------------------------------------------------------------

def test_builtin_problems_by_level_sorted():
    problems = load_problems("builtin")
    files = {lvl: sorted(f.stem for f in (BUILTIN_DIR / f"level{lvl}").glob("*.py")) for lvl in (1, 2, 3)}
    assert len(problems) == sum(len(names) for names in files.values())
    by_level = {lvl: [p.name for p in problems if p.level == lvl] for lvl in (1, 2, 3)}
    for lvl, names in by_level.items():
        assert names[:len(BUILTIN_NAMES[lvl])] == BUILTIN_NAMES[lvl]  # the first problems, then others' additions
        assert sorted(names) == files[lvl]
        assert [int(n.split("_", 1)[0]) for n in names] == list(range(1, len(names) + 1))
    assert problems == sorted(problems, key=lambda p: (p.level, p.id))


def test_builtin_problem_fields():
    for p in load_problems("builtin"):
        assert isinstance(p, Problem)
        assert p.id == int(p.name.split("_", 1)[0])
        assert p.level in (1, 2, 3)
        assert "class Model" in p.code and "def get_inputs" in p.code and "def get_init_inputs" in p.code
        assert p.source and Path(p.source).is_file()
        assert p.size in ("cpu", "gpu")
        assert sized_code(Path(p.source).read_text(encoding="utf-8"), p.size) == p.code
        assert p.key == f"level{p.level}/{p.name}"
    assert get_problem(load_problems("builtin"), name="1_ReLU").key == "level1/1_ReLU"


def test_builtin_level_filter():
    problems = load_problems("builtin", level=2)
    assert [p.name for p in problems][:len(BUILTIN_NAMES[2])] == BUILTIN_NAMES[2]
    assert all(p.level == 2 for p in problems)


def test_builtin_solutions_are_not_problems():
    assert (BUILTIN_DIR / "solutions").is_dir()
    sources = [Path(p.source).resolve() for p in load_problems("builtin")]
    solutions = (BUILTIN_DIR / "solutions").resolve()
    assert not any(solutions in s.parents for s in sources)


# --- folders ----------------------------------------------------------------------------------

def test_flat_folder_level_none_is_level_0(tmp_path):
    write_problem(tmp_path, "2_Second")
    write_problem(tmp_path, "1_First")
    (tmp_path / "_helper.py").write_text("x = 1\n")  # files starting with _ are not problems
    problems = load_problems(tmp_path)
    assert [(p.level, p.id, p.name) for p in problems] == [(0, 1, "1_First"), (0, 2, "2_Second")]
    assert problems[0].key == "level0/1_First"
    assert problems[0].source == str(tmp_path / "1_First.py")


def test_flat_folder_with_level_takes_that_level(tmp_path):
    write_problem(tmp_path, "1_First")
    problems = load_problems(str(tmp_path), level=2)
    assert [(p.level, p.name) for p in problems] == [(2, "1_First")]


def test_folder_with_level_subfolders(tmp_path):
    write_problem(tmp_path / "level1", "1_A")
    write_problem(tmp_path / "level1", "2_B")
    write_problem(tmp_path / "level2", "1_C")
    problems = load_problems(tmp_path)
    assert [p.key for p in problems] == ["level1/1_A", "level1/2_B", "level2/1_C"]
    assert [p.key for p in load_problems(tmp_path, level=2)] == ["level2/1_C"]


def test_kernelbench_checkout_layout_ignores_level4(tmp_path):
    for lvl in (1, 2, 3, 4):
        write_problem(tmp_path / f"level{lvl}", "1_A")
    (tmp_path / "__pycache__").mkdir()
    assert [p.key for p in load_problems(tmp_path)] == ["level1/1_A", "level2/1_A", "level3/1_A"]


# --- Hugging Face schema: jsonl, parquet, folder of level_N.jsonl ------------------------------

def test_jsonl_file(tmp_path):
    path = write_jsonl(tmp_path / "set.jsonl", [hf_row(2, "2_B", 1), hf_row(1, "1_A.py", 1), hf_row(1, "1_C", 3)])
    problems = load_problems(path)
    assert [(p.level, p.id, p.name) for p in problems] == [(1, 1, "1_A"), (1, 2, "2_B"), (3, 1, "1_C")]
    assert problems[0].code == problem_code("1_A.py")
    assert str(path) in problems[0].source
    assert [p.key for p in load_problems(path, level=3)] == ["level3/1_C"]


def test_parquet_file(tmp_path):
    rows = [hf_row(1, "1_A", 1), hf_row(1, "1_B", 2)]
    path = tmp_path / "set.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    problems = load_problems(path)
    assert [p.key for p in problems] == ["level1/1_A", "level2/1_B"]
    assert problems[1].code == problem_code("1_B")


def test_folder_of_level_jsonl_files(tmp_path):
    write_jsonl(tmp_path / "level_1.jsonl", [hf_row(1, "1_A", 1), hf_row(2, "2_B", 1)])
    write_jsonl(tmp_path / "level_2.jsonl", [hf_row(1, "1_C", 2)])
    problems = load_problems(tmp_path)
    assert [p.key for p in problems] == ["level1/1_A", "level1/2_B", "level2/1_C"]
    assert [p.key for p in load_problems(tmp_path, level=1)] == ["level1/1_A", "level1/2_B"]


def test_list_of_problems_passes_through():
    builtin = load_problems("builtin")
    picked = [builtin[5], builtin[0]]
    problems = load_problems(picked)
    assert problems == [builtin[0], builtin[5]]
    assert all(a is b for a, b in zip(problems, [builtin[0], builtin[5]], strict=True))
    assert load_problems(tuple(picked), level=1) == [builtin[0], builtin[5]]


def test_list_with_a_non_problem():
    builtin = load_problems("builtin")
    message = error_of([builtin[0], "1_ReLU"])
    assert "Problem" in message and "str" in message


# --- "official" -------------------------------------------------------------------------------

def test_official_from_kb_gym_dataset(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "level_1.jsonl", [hf_row(1, "1_A", 1), hf_row(2, "2_B", 1)])
    monkeypatch.setenv("KB_GYM_DATASET", str(path))
    assert [p.key for p in load_problems("official")] == ["level1/1_A", "level1/2_B"]
    monkeypatch.setenv("KB_GYM_DATASET", str(tmp_path))  # the folder holding level_N.jsonl works too
    assert [p.key for p in load_problems("official", level=1)] == ["level1/1_A", "level1/2_B"]


def test_official_kb_gym_dataset_missing(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere" / "level_1.jsonl"
    monkeypatch.setenv("KB_GYM_DATASET", str(missing))
    message = error_of("official")
    assert "KB_GYM_DATASET" in message and str(missing) in message


def test_official_offline_says_how_to_get_it(monkeypatch):
    monkeypatch.delenv("KB_GYM_DATASET", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    start = time.monotonic()
    message = error_of("official", level=1)
    assert time.monotonic() - start < 30, "an offline 'official' load must fail fast"
    assert "KB_GYM_DATASET" in message
    assert "ScalingIntelligence/KernelBench" in message
    assert "'builtin'" in message


def test_official_hub_failure_is_a_problem_error(monkeypatch):
    def unreachable(level):
        raise ConnectionError("no network")

    monkeypatch.delenv("KB_GYM_DATASET", raising=False)
    monkeypatch.setattr(loaders, "_from_hugging_face", unreachable)
    message = error_of("official")
    assert "no network" in message and "KB_GYM_DATASET" in message and "'builtin'" in message


# --- bad input --------------------------------------------------------------------------------

def test_unknown_dataset_name_lists_known_names():
    message = error_of("nope")
    assert "'nope'" in message
    for known in ("official", "builtin", "synthetic"):  # synthetic:N[:SEED] too
        assert known in message


def test_missing_path(tmp_path):
    missing = tmp_path / "no_such_folder"
    assert str(missing) in error_of(missing)


def test_wrong_file_type(tmp_path):
    path = tmp_path / "problems.csv"
    path.write_text("code,level\n")
    assert str(path) in error_of(path)


def test_empty_flat_folder(tmp_path):
    message = error_of(tmp_path)
    assert str(tmp_path) in message and "no problem files" in message


def test_parquet_without_needed_columns(tmp_path):
    path = tmp_path / "set.parquet"
    pq.write_table(pa.Table.from_pylist([{"code": problem_code(), "name": "1_A"}]), path)
    message = error_of(path)
    assert str(path) in message
    assert "level" in message and "problem_id" in message
    assert "missing column(s) level, problem_id" in message


def test_jsonl_row_without_needed_fields(tmp_path):
    path = write_jsonl(tmp_path / "set.jsonl", [hf_row(1, "1_A", 1), {"code": problem_code(), "name": "2_B"}])
    message = error_of(path)
    assert str(path) in message and "row 2" in message and "level" in message and "problem_id" in message


def test_jsonl_with_a_corrupt_line(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps(hf_row(1, "1_A", 1)) + "\n" + '{"code": "oops\n', encoding="utf-8")
    assert f"{path}:2" in error_of(path)


def test_problem_file_with_syntax_error(tmp_path):
    bad = problem_code().replace("def get_inputs():", "def get_inputs(:")
    path = write_problem(tmp_path, "1_Broken", bad)
    line = bad.splitlines().index("def get_inputs(:") + 1
    message = error_of(tmp_path)
    assert str(path) in message and "syntax error" in message and f"line {line}" in message


def test_jsonl_problem_with_syntax_error_names_the_row(tmp_path):
    path = write_jsonl(tmp_path / "set.jsonl", [hf_row(7, "7_Broken", 1, code="class Model(:\n")])
    message = error_of(path)
    assert str(path) in message and "7_Broken" in message and "line 1" in message


def test_problem_file_without_model(tmp_path):
    code = problem_code().replace("class Model(nn.Module)", "class Net(nn.Module)")
    path = write_problem(tmp_path, "1_NoModel", code)
    message = error_of(tmp_path)
    assert str(path) in message and "Model" in message and "missing Model" in message


def test_problem_file_name_without_numeric_id(tmp_path):
    path = write_problem(tmp_path, "ReLU")
    message = error_of(tmp_path)
    assert str(path) in message and "problem id" in message


def test_duplicate_problems(tmp_path):
    path = write_jsonl(tmp_path / "set.jsonl", [hf_row(1, "1_A", 1), hf_row(1, "1_A", 1)])
    message = error_of(path)
    assert "duplicate" in message and "level1/1_A" in message


def test_duplicate_problems_across_sources(tmp_path):
    write_problem(tmp_path / "level1", "1_A")
    write_jsonl(tmp_path / "other.jsonl", [hf_row(1, "1_A", 1)])
    problems = load_problems(tmp_path) + load_problems(tmp_path / "other.jsonl")
    assert "duplicate problem level1/1_A" in error_of(problems)


def test_duplicate_ids_within_a_level(tmp_path):
    write_jsonl(tmp_path / "set.jsonl", [hf_row(1, "1_A", 1), hf_row(1, "1_B", 1)])
    message = error_of(tmp_path / "set.jsonl")
    assert "duplicate" in message and "1_A" in message and "1_B" in message


@pytest.mark.parametrize("level", [0, 4, -1, "2"])
def test_bad_level(level):
    message = error_of("builtin", level=level)
    assert "level must be 1, 2 or 3" in message and repr(level) in message


def test_bad_dataset_type():
    assert "int" in error_of(42)


# --- get_problem ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def builtin():
    return load_problems("builtin")


def test_get_problem_by_id_and_level(builtin):
    assert get_problem(builtin, problem_id=3, level=2).key == "level2/3_MatmulGELUResidual"
    assert get_problem(builtin, problem_id=4, level=3).name == "4_ResidualConvStack"


def test_get_problem_by_name(builtin):
    assert get_problem(builtin, name="3_RowSoftmax").key == "level1/3_RowSoftmax"
    assert get_problem(builtin, name="level1/1_ReLU").key == "level1/1_ReLU"
    assert get_problem(builtin, name="1_ReLU.py").key == "level1/1_ReLU"
    assert get_problem(builtin, name="level1/1_ReLU.py").key == "level1/1_ReLU"
    assert get_problem(builtin, name="1_ThreeLayerMLP", level=3).level == 3


def test_get_problem_ambiguous_id(builtin):
    with pytest.raises(ProblemError) as info:
        get_problem(builtin, problem_id=1)
    message = str(info.value)
    assert "3 problems match id=1" in message
    assert "level1/1_ReLU" in message and "level2/1_LinearBiasReLUScale" in message
    assert "level" in message.rsplit(";", 1)[-1]  # says to give the level


def test_get_problem_not_found(builtin):
    with pytest.raises(ProblemError, match="no problem with name='99_Nothing'"):
        get_problem(builtin, name="99_Nothing")
    with pytest.raises(ProblemError, match=f"no problem with id=999 at level 1 among {len(builtin)} problems"):
        get_problem(builtin, problem_id=999, level=1)
    with pytest.raises(ProblemError, match="no problem"):
        get_problem(builtin, name="level2/1_ReLU")


# --- the CLI ----------------------------------------------------------------------------------

def test_cli_list_builtin(capsys):
    assert main(["list", "--dataset", "builtin"]) == 0
    lines = capsys.readouterr().out.splitlines()
    keys = [p.key for p in load_problems("builtin")]
    assert len(lines) == len(keys) + 1
    assert lines[0] == "level1/1_ReLU"
    assert lines[:-1] == keys
    assert lines[-1] == f"{len(keys)} problems"


def test_cli_list_level(capsys):
    assert main(["list", "--dataset", "builtin", "--level", "3"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{len(load_problems('builtin', level=3))} problems"


def test_cli_list_unknown_dataset(capsys):
    assert main(["list", "--dataset", "nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("kb-gym: ") and "'nope'" in err and "builtin" in err
    assert "Traceback" not in err


# --- sizes: the "# gpu:" annotations ------------------------------------------------------------

SIZED = (
    "import torch\nimport torch.nn as nn\n\n\n"
    "class Model(nn.Module):\n    \"\"\"Scale: out = 2 * x.\"\"\"\n\n"
    "    def forward(self, x):\n        return 2 * x  # a comment in the code stays\n\n\n"
    "# sizes below; this comment stays too\n"
    "batch = 16  # gpu: 4096\n"
    "width = 8 * 4    #gpu: 16 * 1024\n"
    "kernel = (3, 3)  # gpu: (5, 5)\n"
    "scale = 0.5  # a plain comment\n"
    "doc = \"not an annotation: # gpu: 7\"\n\n\n"
    "def get_inputs():\n    return [torch.randn(batch, width)]\n\n\n"
    "def get_init_inputs():\n    return []\n"
)


def test_sized_code_at_both_sizes():
    gpu = sized_code(SIZED, "gpu")
    cpu = sized_code(SIZED, "cpu")
    for code in (gpu, cpu):
        assert "# gpu:" not in code.replace('"not an annotation: # gpu: 7"', "")
        assert "# a comment in the code stays" in code and "# sizes below; this comment stays too" in code
        assert "scale = 0.5  # a plain comment\n" in code and 'doc = "not an annotation: # gpu: 7"\n' in code
        assert len(code.splitlines()) == len(SIZED.splitlines())
    assert "batch = 4096\nwidth = 16 * 1024\nkernel = (5, 5)\n" in gpu
    assert "batch = 16\nwidth = 8 * 4\nkernel = (3, 3)\n" in cpu
    assert sized_code(cpu, "gpu") == cpu  # no annotations left: nothing to rewrite
    assert sized_code(problem_code(), "gpu") == problem_code()
    assert sized_code(SIZED.replace("\n", "\r\n"), "gpu") == gpu.replace("\n", "\r\n")


@pytest.mark.parametrize("lines, what", [
    ("batch = 16  # gpu: torch.randn(3)", "must be a literal"),  # a call
    ("batch = 16  # gpu: other * 2", "must be a literal"),       # a name
    ("batch = 16  # gpu: __import__('os')", "must be a literal"),
    ("batch = 16  # gpu: 4096)", "not a Python expression"),
    ("if True:\n    batch = 16  # gpu: 4096", "malformed size annotation"),  # not at column 0
    ("batch = 16  # gpu: 4096  # and more", "malformed size annotation"),
    ("batch = 16\n# gpu: 4096", "malformed size annotation"),  # no assignment
    ("batch = 16  # gpu:", "malformed size annotation"),        # no value
])
def test_malformed_annotation_names_file_and_line(tmp_path, lines, what):
    code = SIZED.replace("batch = 16  # gpu: 4096", lines)
    bad = next(line for line in lines.splitlines() if "# gpu:" in line)
    lineno = code.splitlines().index(bad) + 1
    path = write_problem(tmp_path / "level1", "1_Bad", code)
    message = error_of(tmp_path, size="cpu")  # checked at either size
    assert f"{path}:{lineno}" in message and what in message
    with pytest.raises(ProblemError, match=what):
        sized_code(code, "gpu", "where.py")


def test_bad_size_value():
    assert "size must be one of 'auto', 'cpu', 'gpu'" in error_of("builtin", size="big")
    with pytest.raises(ProblemError, match="size must be one of 'cpu', 'gpu'"):
        sized_code(SIZED, "auto")


def test_folder_of_our_problem_files_is_sized(tmp_path):
    write_problem(tmp_path / "level1", "1_Sized", SIZED)
    write_problem(tmp_path / "level1", "2_Plain")
    gpu = {p.name: p for p in load_problems(tmp_path, size="gpu")}
    cpu = {p.name: p for p in load_problems(tmp_path, size="cpu")}
    assert gpu["1_Sized"].code == sized_code(SIZED, "gpu") and gpu["1_Sized"].size == "gpu"
    assert cpu["1_Sized"].code == sized_code(SIZED, "cpu") and cpu["1_Sized"].size == "cpu"
    assert gpu["1_Sized"].key == cpu["1_Sized"].key and gpu["1_Sized"].code_hash != cpu["1_Sized"].code_hash
    assert gpu["2_Plain"].code == cpu["2_Plain"].code == problem_code("2_Plain")
    assert gpu["2_Plain"].size == cpu["2_Plain"].size == ""  # nothing says what size it is


def test_size_auto_follows_torch_or_the_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert {p.size for p in load_problems("builtin", level=1)} == {"cpu"}
    assert {p.size for p in load_problems("builtin", level=1, device="cuda:0")} == {"gpu"}  # names only
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert {p.size for p in load_problems("builtin", level=1)} == {"gpu"}
    assert {p.size for p in load_problems("builtin", level=1, device="cpu")} == {"cpu"}
    assert {p.size for p in load_problems("builtin", level=1, device="cuda:0,cpu")} == {"cpu"}  # mixed: cpu
    assert {p.size for p in load_problems("builtin", level=1, device=["cuda:0", "cuda:1"])} == {"gpu"}


BUILTIN_KEYS = sorted(f"{f.parent.name}/{f.stem}" for f in BUILTIN_DIR.glob("level[1-3]/*.py"))
ORIGINAL_18 = [f"level{lvl}/{name}" for lvl, names in BUILTIN_NAMES.items() for name in names]


@pytest.fixture(scope="module")
def builtin_at():
    """``{size: {key: Problem}}`` for the built-in set at both sizes."""
    return {size: {p.key: p for p in load_problems("builtin", size=size)} for size in ("cpu", "gpu")}


@pytest.mark.parametrize("key", BUILTIN_KEYS)
def test_every_builtin_problem_loads_at_both_sizes(builtin_at, key):
    from kb_gym.problems.sizes import size_annotations

    cpu, gpu = builtin_at["cpu"][key], builtin_at["gpu"][key]
    text = Path(cpu.source).read_text(encoding="utf-8")
    annotations = size_annotations(text, cpu.source)
    assert annotations, f"{cpu.key}: no '# gpu:' annotation (every built-in problem has a GPU size)"
    assert (cpu.size, gpu.size) == ("cpu", "gpu")
    assert cpu.code != gpu.code and cpu.code_hash != gpu.code_hash
    for code, size in ((cpu.code, "cpu"), (gpu.code, "gpu")):
        assert "# gpu:" not in code and size_annotations(code) == []
        check_problem_code(code, f"{cpu.key}@{size}")
        for a in annotations:
            assert f"\n{a.name} = {a.cpu if size == 'cpu' else a.gpu}\n" in code


def _meta_forward(problem: Problem):
    """Build the model and run forward on meta tensors: shapes only, no memory, no compute."""
    import torch

    namespace: dict = {}
    exec(compile(problem.code, problem.key, "exec"), namespace)  # our own built-in file
    with torch.device("meta"), torch.no_grad():
        model = namespace["Model"](*namespace["get_init_inputs"]())
        inputs = namespace["get_inputs"]()
        out = model(*inputs)
    return model, inputs, list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("key", ORIGINAL_18)
def test_gpu_size_builds_and_runs_on_meta(builtin_at, key):
    import torch

    model, inputs, outs = _meta_forward(builtin_at["gpu"][key])
    _, cpu_inputs, cpu_outs = _meta_forward(builtin_at["cpu"][key])
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    assert all(t.is_meta for t in tensors + outs)
    assert [o.dim() for o in outs] == [o.dim() for o in cpu_outs]
    assert sum(t.numel() for t in tensors) > 100 * sum(t.numel() for t in cpu_inputs if isinstance(t, torch.Tensor))
    size = sum(t.numel() * t.element_size() for t in tensors + outs + list(model.parameters()))
    assert size < 8e9, f"{key}: inputs, outputs and parameters take {size / 1e9:.1f} GB at GPU size"
    assert all(t.numel() < 2**31 for t in tensors + outs)  # int32 offsets in a kernel still reach every element


def test_official_and_tables_have_one_size(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "level_1.jsonl", [hf_row(1, "1_A", 1), hf_row(2, "2_B", 1)])
    monkeypatch.setenv("KB_GYM_DATASET", str(path))
    for size in ("auto", "gpu"):
        official = load_problems("official", size=size)
        assert [p.code for p in official] == [problem_code("1_A"), problem_code("2_B")]
        assert {p.size for p in official} == {"gpu"}
        assert [p.code for p in load_problems(path, size=size)] == [p.code for p in official]
    message = error_of("official", size="cpu")
    assert "size='cpu'" in message and "one size" in message and "builtin" in message
    assert str(path) in error_of(path, size="cpu") and str(tmp_path) in error_of(tmp_path, size="cpu")


def test_official_folder_copy_is_taken_as_it_is(tmp_path, monkeypatch):
    write_problem(tmp_path / "level1", "1_Sized", SIZED)  # an official copy is never rewritten
    monkeypatch.setenv("KB_GYM_DATASET", str(tmp_path))
    (problem,) = load_problems("official")
    assert problem.code == SIZED and problem.size == "gpu"


def test_list_of_problems_keeps_its_sizes():
    cpu = load_problems("builtin", level=1, size="cpu")[:3]
    assert load_problems(cpu) == cpu and load_problems(cpu, size="cpu") == cpu
    assert "loaded at size 'cpu', not 'gpu'" in error_of(cpu, size="gpu")
    raw = Problem(id=1, name="1_Sized", level=1, code=SIZED)  # unsized, annotated: rewritten like a file
    (sized,) = load_problems([raw], size="gpu")
    assert sized.code == sized_code(SIZED, "gpu") and sized.size == "gpu"
    plain = Problem(id=1, name="1_Plain", level=1, code=problem_code())
    assert load_problems([plain], size="gpu") == [plain]


def test_problem_size_round_trips_through_dict():
    p = get_problem(load_problems("builtin", level=1, size="gpu"), name="1_ReLU")
    data = p.to_dict()
    assert data["size"] == "gpu" and Problem.from_dict(data) == p
    del data["size"]
    assert Problem.from_dict(data).size == ""


def test_synthetic_takes_the_size(monkeypatch):
    import kb_gym.problems.synthetic as synthetic

    cpu = load_problems("synthetic:6", size="cpu")
    gpu = load_problems("synthetic:6", size="gpu")
    assert {p.size for p in cpu} == {"cpu"} and {p.size for p in gpu} == {"gpu"}
    assert [p.key for p in cpu] == [p.key for p in gpu]

    def old_generator(n, seed, level=None):  # a generator from before sizes
        return cpu

    monkeypatch.setattr(synthetic, "generate_problems", old_generator)
    assert load_problems("synthetic:6", size="cpu") == cpu
    assert "size='gpu'" in error_of("synthetic:6", size="gpu")


# --- splits ---------------------------------------------------------------------------------------

def fake_problems(n: int, level: int = 1, start: int = 1) -> list[Problem]:
    return [Problem(id=i, name=f"{i}_Fake", level=level, code=problem_code()) for i in range(start, start + n)]


def test_split_rule_deterministic_disjoint_and_about_a_fifth():
    problems = fake_problems(3000, 1) + fake_problems(2000, 2)
    train, test = select_split(problems, "train"), select_split(problems, "test")
    assert select_split(problems, "test") == test and assign_splits(problems) == assign_splits(problems)
    assert not {p.key for p in train} & {p.key for p in test}
    assert len(train) + len(test) == len(problems)
    assert 0.18 < len(test) / len(problems) < 0.22
    for p in problems:  # the hash alone: SHA-256 of the key, never Python's salted hash()
        assert (p in test) == (split_hash(p.key) < loaders.TEST_SHARE)
    assert split_hash("level1/1_ReLU") == int(__import__("hashlib").sha256(b"level1/1_ReLU").hexdigest()[:16], 16) / 2**64


def test_split_of_a_problem_never_changes_when_others_are_added():
    problems = fake_problems(40, 1) + fake_problems(30, 2)
    before = assign_splits(problems)
    more = problems + fake_problems(25, 1, start=41) + fake_problems(5, 3)
    after = assign_splits(more)
    assert {k: after[k] for k in before} == before


def test_small_level_gets_one_test_problem():
    level = [p for p in fake_problems(200) if split_hash(p.key) >= loaders.TEST_SHARE][:5]
    assert assign_splits(level[:4]) == {p.key: "train" for p in level[:4]}  # under 5 problems: no fallback
    splits = assign_splits(level)
    lowest = min(level, key=lambda p: split_hash(p.key))
    assert [k for k, v in splits.items() if v == "test"] == [lowest.key]
    # once a problem of the level hashes into test, the fallback is gone and nothing else moves
    hashed = next(p for p in fake_problems(200, start=201) if split_hash(p.key) < loaders.TEST_SHARE)
    splits = assign_splits([*level, hashed])
    assert [k for k, v in splits.items() if v == "test"] == [hashed.key]


def test_builtin_splits():
    everything = load_problems("builtin", size="cpu")
    train = load_problems("builtin", size="cpu", split="train")
    test = load_problems("builtin", size="cpu", split="test")
    assert sorted(p.key for p in train + test) == sorted(p.key for p in everything)
    assert not {p.key for p in train} & {p.key for p in test}
    for lvl in (1, 2, 3):
        if sum(p.level == lvl for p in everything) >= loaders.MIN_LEVEL_FOR_TEST:
            assert any(p.level == lvl for p in test), lvl
    assert [p.key for p in load_problems("builtin", level=2, size="gpu", split="test")] == [
        p.key for p in test if p.level == 2]  # the level filter and the size do not move problems
    assert "level1/8_EmbeddingLookup" in {p.key for p in test}  # the rule, pinned: this one hashes into test
    assert "level1/1_ReLU" in {p.key for p in train}
    assert "split must be 'train', 'test' or None" in error_of("builtin", split="validation")


def test_synthetic_splits():
    problems = load_problems("synthetic", size="cpu")
    test = load_problems("synthetic", size="cpu", split="test")
    assert [p.key for p in test] == [p.key for p in select_split(problems, "test")]
    assert 0 < len(test) < len(problems) / 2


def test_official_is_for_evaluation_only(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "level_1.jsonl", [hf_row(i, f"{i}_P", 1) for i in range(1, 11)])
    monkeypatch.setenv("KB_GYM_DATASET", str(path))
    everything = load_problems("official")
    assert load_problems("official", split="test") == everything
    message = error_of("official", split="train")
    assert "evaluation set" in message and "fast_p" in message and "allow_official_train=True" in message
    assert load_problems("official", split="train", allow_official_train=True) == everything
    assert len(load_problems(path, split="test")) < len(everything)  # the same file by path: the hash rule


def test_cli_size_and_split(capsys, tmp_path, monkeypatch):
    assert main(["list", "--dataset", "builtin", "--size", "gpu", "--split", "test"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:-1] == [p.key for p in load_problems("builtin", split="test")]
    monkeypatch.setenv("KB_GYM_DATASET", str(write_jsonl(tmp_path / "level_1.jsonl", [hf_row(1, "1_A", 1)])))
    assert main(["list", "--dataset", "official", "--split", "train"]) == 2
    assert "evaluation set" in capsys.readouterr().err
    assert main(["list", "--dataset", "official", "--size", "cpu"]) == 2
    assert "size='cpu'" in capsys.readouterr().err
