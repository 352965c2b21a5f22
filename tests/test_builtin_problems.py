"""The built-in problem set: every problem runs, quickly, with a sane output; every solution matches.

On a machine without a GPU the solutions run here through the Triton interpreter, so TRITON_INTERPRET is
set before triton is imported (triton.jit reads it when a kernel is decorated). On a GPU machine it is not
set: it would reach every Triton kernel the pytest process decorates later (TRL's, in the GPU training
test) and one process cannot mix the modes; there the solutions are checked on the GPU by
tests/gpu/test_gpu_engine.py::test_triton_solutions_correct_on_gpu instead.

CUDA solutions (a load_inline extension) need nvcc and a GPU to build and run: without CUDA they are
skipped here, with that reason, and checked by the same two GPU tests (which take every solution file).
"""

import importlib.util
import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from kb_gym.problems.solutions import solution_backend

ON_GPU_MACHINE = torch.cuda.is_available()
if not ON_GPU_MACHINE:
    os.environ["TRITON_INTERPRET"] = "1"

BUILTIN = Path(__file__).resolve().parents[1] / "problems" / "builtin"
LEVEL_DIRS = sorted(p for p in BUILTIN.glob("level*") if p.is_dir())
PROBLEM_FILES = sorted(f for d in LEVEL_DIRS for f in d.glob("*.py"))
SOLUTION_FILES = sorted((BUILTIN / "solutions").glob("level*/*.py"))
CUDA_SOLUTIONS = {f for f in SOLUTION_FILES if solution_backend(f) == "cuda"}
MIN_CUDA_SOLUTIONS = 4  # issue 12: CUDA load_inline kernels for at least 4 built-in problems
CUDA_SKIP = ("CUDA load_inline solution: building and running it needs nvcc and a GPU; checked on the GPU by "
             "tests/gpu/test_gpu_engine.py::test_triton_solutions_correct_on_gpu and ::..._at_gpu_size")
MIN_PER_LEVEL = {"level1": 40, "level2": 40, "level3": 12}  # issue 12: a set worth training on
ALLOWED_IMPORTS = {"torch", "torch.nn", "torch.nn.functional"}
NAME_RE = re.compile(r"^([1-9][0-9]*)_[A-Za-z0-9_]+\.py$")
FORWARD_LIMIT_S = 1.0


def _rel(path: Path) -> str:
    return path.relative_to(BUILTIN).as_posix()


def _load(path: Path):
    """Import a file under a unique module name (no sys.modules clash between same-named files)."""
    mod_name = "_kb_builtin_" + re.sub(r"\W", "_", _rel(path))
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def _as_list(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def test_layout():
    assert [d.name for d in LEVEL_DIRS] == ["level1", "level2", "level3"]
    for level_dir in LEVEL_DIRS:
        files = sorted(level_dir.glob("*.py"))
        assert len(files) >= MIN_PER_LEVEL[level_dir.name], level_dir.name
        ids = []
        for f in files:
            m = NAME_RE.match(f.name)
            assert m, f"bad problem file name: {_rel(f)}"
            ids.append(int(m.group(1)))
        assert sorted(ids) == list(range(1, len(ids) + 1)), f"{level_dir.name}: ids {sorted(ids)}"
    for sol in SOLUTION_FILES:
        assert (BUILTIN / sol.parent.name / sol.name).is_file(), f"solution without problem: {_rel(sol)}"
    per_level = {d: sum(1 for s in SOLUTION_FILES if s.parent.name == d) for d in ("level1", "level2")}
    assert per_level["level1"] >= 3 and per_level["level2"] >= 1, per_level
    assert len(CUDA_SOLUTIONS) >= MIN_CUDA_SOLUTIONS, sorted(map(_rel, CUDA_SOLUTIONS))
    assert len({s.parent.name for s in CUDA_SOLUTIONS}) >= 2, "CUDA solutions on one level only"


def _solution_param(path: Path):
    """A CUDA solution is skipped, with its reason, where torch sees no GPU (no nvcc to build it either)."""
    marks = [pytest.mark.skip(reason=CUDA_SKIP)] if path in CUDA_SOLUTIONS and not ON_GPU_MACHINE else []
    return pytest.param(path, id=_rel(path), marks=marks)


@pytest.mark.parametrize("path", PROBLEM_FILES, ids=_rel)
def test_problem_imports_only_torch(path):
    import ast

    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {node.module or ""}
        else:
            continue
        assert names <= ALLOWED_IMPORTS, f"{_rel(path)} imports {names - ALLOWED_IMPORTS}"
    model_cls = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"]
    assert model_cls and ast.get_docstring(model_cls[0]), "Model needs a docstring"


@pytest.mark.parametrize("path", PROBLEM_FILES, ids=_rel)
def test_problem_runs(path):
    mod = _load(path)
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs())
    inputs = mod.get_inputs()
    assert isinstance(inputs, list) and inputs
    originals = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    with torch.no_grad():
        model(*inputs)  # warm-up (first-call allocations, lazy init)
        start = time.perf_counter()
        out = model(*inputs)
        elapsed = time.perf_counter() - start
    assert elapsed < FORWARD_LIMIT_S, f"{_rel(path)}: forward took {elapsed:.3f}s"
    for o in _as_list(out):
        assert isinstance(o, torch.Tensor)
        if not o.is_floating_point():  # indices (argmin/argmax): int64, and not all the same
            assert o.dtype == torch.int64, f"{_rel(path)}: integer output of dtype {o.dtype}"
            assert o.unique().numel() > 1, f"{_rel(path)}: output is constant"
            continue
        assert o.dtype == torch.float32
        assert torch.isfinite(o).all(), f"{_rel(path)}: non-finite output"
        assert o.abs().mean().item() > 1e-2, f"{_rel(path)}: output is degenerate (near zero)"
        assert o.std().item() > 1e-3, f"{_rel(path)}: output is (nearly) constant"
    for before, after in zip(originals, inputs, strict=True):
        if isinstance(before, torch.Tensor):
            assert torch.equal(before, after), f"{_rel(path)}: forward mutated its input"
    # Deterministic given the seed.
    torch.manual_seed(0)
    model2 = mod.Model(*mod.get_init_inputs())
    with torch.no_grad():
        out2 = model2(*inputs)
    for a, b in zip(_as_list(out), _as_list(out2), strict=True):
        assert torch.equal(a, b), f"{_rel(path)}: not deterministic"


def _tolerance(problem_src: str) -> float:
    has_matmul = any(k in problem_src for k in ("nn.Linear", "@", "matmul", "Conv"))
    return 1e-3 if has_matmul else 1e-4


@pytest.mark.parametrize("path", [_solution_param(f) for f in SOLUTION_FILES])
@pytest.mark.skipif(ON_GPU_MACHINE, reason="checked on the GPU by test_triton_solutions_correct_on_gpu")
def test_solution_matches_reference(path):
    problem_path = BUILTIN / path.parent.name / path.name
    ref_mod = _load(problem_path)
    sol_mod = _load(path)
    assert hasattr(sol_mod, "ModelNew")
    init_args = ref_mod.get_init_inputs()
    torch.manual_seed(1)
    inputs = ref_mod.get_inputs()

    torch.manual_seed(0)
    ref = ref_mod.Model(*init_args)
    torch.manual_seed(0)
    new = sol_mod.ModelNew(*init_args)

    ref_params = [p.shape for p in ref.parameters()]
    new_params = [p.shape for p in new.parameters()]
    assert ref_params == new_params, "ModelNew must create the same parameters in the same order"

    with torch.no_grad():
        out_ref = _as_list(ref(*[t.clone() for t in inputs]))
        start = time.perf_counter()
        out_new = _as_list(new(*[t.clone() for t in inputs]))
        elapsed = time.perf_counter() - start
    tol = _tolerance(problem_path.read_text())
    assert len(out_ref) == len(out_new)
    for r, n in zip(out_ref, out_new, strict=True):
        assert n.shape == r.shape and n.dtype == r.dtype
        err = (n - r).abs().max().item()
        assert torch.allclose(n, r, atol=tol, rtol=tol), f"{_rel(path)}: max abs err {err:.3g}"
    # Under the interpreter; generous, but catches a solution that would make the suite crawl.
    assert elapsed < 5.0, f"{_rel(path)}: interpreted forward took {elapsed:.2f}s"


@pytest.mark.parametrize("path", sorted(CUDA_SOLUTIONS), ids=_rel)
def test_cuda_solution_names_its_extension_and_builds_the_reference_parameters(path, monkeypatch):
    """What a CUDA solution's source can show without nvcc: one named load_inline build with kernels, C++
    glue and the functions forward calls, and the reference's parameters (same order, same values)."""
    import torch.utils.cpp_extension as cpp_extension

    builds = []

    class _Extension:
        def __getattr__(self, name):
            raise AssertionError("no kernel can run here")

    def fake_load_inline(name, cpp_sources, cuda_sources=None, functions=None, **kwargs):
        builds.append({"name": name, "cpp": cpp_sources, "cuda": cuda_sources, "functions": functions})
        return _Extension()

    monkeypatch.setattr(cpp_extension, "load_inline", fake_load_inline)
    sol_mod = _load(path)
    assert len(builds) == 1, builds
    build = builds[0]
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", build["name"]), build["name"]
    assert "__global__" in build["cuda"] and build["functions"]
    for fn in build["functions"]:
        assert re.search(rf"\b{fn}\s*\(", build["cpp"]), f"{fn} is not defined in cpp_sources"
        assert f".{fn}(" in path.read_text(), f"{fn} is never called"
    ref_mod = _load(BUILTIN / path.parent.name / path.name)
    init_args = ref_mod.get_init_inputs()
    torch.manual_seed(0)
    ref = ref_mod.Model(*init_args)
    torch.manual_seed(0)
    new = sol_mod.ModelNew(*init_args)
    ref_params, new_params = list(ref.parameters()), list(new.parameters())
    assert [p.shape for p in ref_params] == [p.shape for p in new_params]
    assert all(torch.equal(a, b) for a, b in zip(ref_params, new_params, strict=True))
