"""The problem loaders: every dataset source, the selectors, and a clear ProblemError for bad input."""

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kb_gym.problems.loaders as loaders
from kb_gym.cli import main
from kb_gym.problems import BUILTIN_DIR, Problem, ProblemError, get_problem, load_problems

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

def test_builtin_has_18_problems_by_level_sorted():
    problems = load_problems("builtin")
    assert len(problems) == 18
    by_level = {lvl: [p.name for p in problems if p.level == lvl] for lvl in (1, 2, 3)}
    assert {lvl: len(names) for lvl, names in by_level.items()} == {1: 8, 2: 6, 3: 4}
    assert by_level == BUILTIN_NAMES
    assert problems == sorted(problems, key=lambda p: (p.level, p.id))


def test_builtin_problem_fields():
    for p in load_problems("builtin"):
        assert isinstance(p, Problem)
        assert p.id == int(p.name.split("_", 1)[0])
        assert p.level in (1, 2, 3)
        assert "class Model" in p.code and "def get_inputs" in p.code and "def get_init_inputs" in p.code
        assert p.source and Path(p.source).is_file()
        assert Path(p.source).read_text(encoding="utf-8") == p.code
        assert p.key == f"level{p.level}/{p.name}"
    assert get_problem(load_problems("builtin"), name="1_ReLU").key == "level1/1_ReLU"


def test_builtin_level_filter():
    problems = load_problems("builtin", level=2)
    assert [p.name for p in problems] == BUILTIN_NAMES[2]
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
    with pytest.raises(ProblemError, match="no problem with id=9 at level 1 among 18 problems"):
        get_problem(builtin, problem_id=9, level=1)
    with pytest.raises(ProblemError, match="no problem"):
        get_problem(builtin, name="level2/1_ReLU")


# --- the CLI ----------------------------------------------------------------------------------

def test_cli_list_builtin(capsys):
    assert main(["list", "--dataset", "builtin"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 19
    assert lines[0] == "level1/1_ReLU"
    assert lines[:18] == [p.key for p in load_problems("builtin")]
    assert lines[-1] == "18 problems"


def test_cli_list_level(capsys):
    assert main(["list", "--dataset", "builtin", "--level", "3"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "4 problems"


def test_cli_list_unknown_dataset(capsys):
    assert main(["list", "--dataset", "nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("kb-gym: ") and "'nope'" in err and "builtin" in err
    assert "Traceback" not in err
