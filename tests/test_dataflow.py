"""The dataflow trace (kb_gym/worker/dataflow.py) on forwards written out here: which outputs PyTorch computed alone.

Each forward stands for a candidate: ``launch`` plays a kernel (its body runs unrecorded, as a Triton launch or an
extension call does), everything else is PyTorch. The trace runs twice, as the judge runs it (two seeds), and the
second run's report is what the judge reads: ``untainted`` lists the outputs no kernel's work reached.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch

from kb_gym.worker.dataflow import DataflowTrace, launch_tensors

_SEEDS = itertools.count(1)


def traced(forward, shape=(8, 16)):
    """The second run's report of ``forward(x, launch)`` over two fresh inputs. Fresh for the whole module, as the
    judge's are: with one seed pair for every test, a buffer from ``empty_like`` could get the block that held this
    very launch's values in the test before (CI, under load), and a launch that changes nothing wrote nothing."""
    seeds = (next(_SEEDS), next(_SEEDS))
    previous = None
    for phase, seed in enumerate(seeds, start=1):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        trace = DataflowTrace(1e-5, 1e-5, contextlib.nullcontext, previous=None if phase == 1 else previous or {})
        trace.add_input(x)

        def launch(name, *tensors, body, _trace=trace):
            return _trace.launch(name, tensors, {}, lambda: body(*tensors))

        with torch.no_grad(), trace:
            out = forward(x, launch)
        previous = trace.writes
        outs = list(out) if isinstance(out, tuple) else [out]
    return trace.report(outs)


def pytorchs(report) -> bool:
    """As the judge reads it (correctness.pytorch_alone): every output untainted or computed by PyTorch anyway."""
    return len(set(report["untainted"]) | set(report["computed"])) == report["outputs"]


# --- what a kernel that does the work looks like --------------------------------------------------------------------

def test_an_answer_a_kernel_computes_is_the_kernels():
    def forward(x, launch):
        out = torch.empty_like(x)
        launch("affine", x, out, body=lambda a, o: o.copy_(a * 2 + 1))
        return out

    report = traced(forward)
    assert not pytorchs(report) and report["kernel_writes"] == 1, report


def test_partial_fusion_pytorch_matmul_and_a_kernel_epilogue_is_the_kernels():
    w, b = torch.randn(16, 16), torch.randn(16)

    def forward(x, launch):
        mm = x @ w  # cuBLAS's part
        out = torch.empty_like(mm)
        launch("bias_relu", mm, out, body=lambda m, o: o.copy_(torch.relu(m + b)))
        return out

    assert not pytorchs(traced(forward))


def test_a_pytorch_op_over_a_kernels_output_is_the_kernels():
    def forward(x, launch):
        h = torch.empty_like(x)
        launch("gelu", x, h, body=lambda a, o: o.copy_(torch.nn.functional.gelu(a)))
        return h * 2.0 + x  # PyTorch finishes: the answer still carries the kernel's work

    assert not pytorchs(traced(forward))


def test_a_reduction_to_one_element_that_follows_the_inputs_is_the_kernels():
    def forward(x, launch):
        loss = torch.zeros(1)
        launch("mse", x, loss, body=lambda a, o: o.copy_((a * a).mean().reshape(1)))
        return loss

    report = traced(forward)
    assert not pytorchs(report) and report.get("constant_writes", 0) == 0, report


def test_tuple_outputs_are_pytorchs_only_where_every_one_is():
    def forward(x, launch):
        h = torch.empty_like(x)
        launch("tanh", x, h, body=lambda a, o: o.copy_(torch.tanh(a)))
        return h, torch.sigmoid(x)  # one output the kernel's, one PyTorch's

    report = traced(forward)
    assert report["untainted"] == [1] and report["computed"] == [] and not pytorchs(report), report


# --- what a kernel that only moves PyTorch's answer looks like ------------------------------------------------------

def test_pytorch_alone_with_no_launch_is_pytorchs():
    assert pytorchs(traced(lambda x, launch: x * 2 + 1))


def test_a_kernel_copying_pytorchs_answer_out_is_pytorchs():
    def forward(x, launch):
        y = x * 2 + 1
        out = torch.empty_like(y)
        launch("copy", y, out, body=lambda a, o: o.copy_(a))
        return out

    report = traced(forward)
    assert pytorchs(report) and report["copies"] == 1, report


def test_a_kernel_moving_one_element_into_pytorchs_answer_is_pytorchs():
    def forward(x, launch):
        y = x * 2 + 1
        out = torch.full_like(y, float("nan"))
        out.view(-1)[1:] = y.view(-1)[1:]
        launch("first", y, out, body=lambda a, o: o.view(-1)[:1].copy_(a.view(-1)[:1]))
        return out

    assert pytorchs(traced(forward))


def test_a_moved_answer_whose_source_was_freed_is_still_pytorchs():
    # the source is gone by the launch: the copy is known by the bits PyTorch computed earlier
    def forward(x, launch):
        y = x * 2 + 1
        first = y.view(-1)[:1].clone()
        out = torch.full_like(y, float("nan"))
        out.view(-1)[1:] = y.view(-1)[1:]
        del y
        launch("first", first, out, body=lambda a, o: o.view(-1)[:1].copy_(a))
        return out

    assert pytorchs(traced(forward))


def test_a_kernel_copying_the_input_in_is_pytorchs():
    def forward(x, launch):
        buf = torch.empty_like(x)
        launch("copy_in", x, buf, body=lambda a, o: o.copy_(a))
        return buf * 2 + 1

    assert pytorchs(traced(forward))


@pytest.mark.parametrize("value", [1.0, 0.0, 3.0])
def test_a_kernel_writing_a_constant_pytorch_uses_is_pytorchs(value):
    def forward(x, launch):
        c = torch.full((1,), float("nan"))  # not empty(): fresh memory may hold the value already (no write then)
        launch("const", c, body=lambda o: o.fill_(value))
        y = x * 2 + 1
        return y * (c / value) if value else y + c

    report = traced(forward)
    assert pytorchs(report) and report["constant_writes"] == 1, report


def test_a_kernel_writing_zeros_into_pytorchs_last_op_is_pytorchs():
    def forward(x, launch):
        z = torch.empty_like(x)
        launch("zeros", x, z, body=lambda a, o: o.copy_(a * 0))
        return torch.relu(x) + (z - 0.0)

    assert pytorchs(traced(forward))


def test_a_kernel_that_writes_what_nobody_reads_is_pytorchs():
    def forward(x, launch):
        scratch = torch.empty_like(x)
        launch("busy", x, scratch, body=lambda a, o: o.copy_(a.sin()))
        return x * 2 + 1

    assert pytorchs(traced(forward))


# --- the trace's plumbing -------------------------------------------------------------------------------------------

def test_launch_tensors_finds_tensors_in_lists_and_descriptors():
    a, b, c = torch.zeros(1), torch.zeros(2), torch.zeros(3)

    class Descriptor:  # Triton's TensorDescriptor keeps its tensor in ``base``
        base = c

    found = launch_tensors((a, [b, 3], Descriptor()), {"n": 4})
    assert [t.numel() for t in found] == [1, 2, 3]


def test_an_in_place_pytorch_op_on_a_kernels_tensor_keeps_it_the_kernels():
    def forward(x, launch):
        out = torch.empty_like(x)
        launch("exp", x, out, body=lambda a, o: o.copy_(a.exp()))
        out.mul_(2.0)
        out[0] = 1.0
        return out

    assert not pytorchs(traced(forward))


@pytest.mark.parametrize(("scale", "how"), [(1e-30, "undone"), (1e-7, "computed")])
def test_a_kernel_adding_a_negligible_term_to_pytorchs_answer_is_pytorchs(scale, how):
    # the term follows the inputs (no constant) and is no copy, but the answer existed before the kernel touched it:
    # 1e-30 rounds away (the sum is exactly PyTorch's answer), 1e-7 changes low bits within the tolerance
    def forward(x, launch):
        y = x * 2 + 1
        tiny = torch.empty_like(x)
        launch("tiny", x, tiny, body=lambda a, o: o.copy_(a * scale))
        return y + tiny

    report = traced(forward)
    assert pytorchs(report) and report["computed" if how == "computed" else "untainted"] == [0], report
    assert bool(report.get("undone")) == (how == "undone"), report


# --- the judge's verdict on our own kernels -------------------------------------------------------------------------

def test_every_builtin_triton_solution_keeps_its_credit():
    """The trace leaves honest kernels alone: every Triton solution of ours (CPU size, Triton's interpreter) is
    correct through the evaluator, and neither the trace nor the knockout calls it a token (CUDA ones: on a GPU,
    tests/gpu/test_gpu_engine.py)."""
    from kb_gym import Evaluator, get_problem, load_problems
    from kb_gym.problems.solutions import solution_files

    problems = load_problems("builtin", size="cpu")
    wrong = {}
    with Evaluator("cpu", results_path=False, baseline_cache=False) as ev:
        config = ev.config.replace(trials=1, timing=False)
        for path in solution_files("cpu"):
            problem = get_problem(problems, name=f"{path.parent.name}/{path.stem}")
            r = ev.evaluate(problem, path.read_text(), config=config)
            if r.status != "correct" or "token_kernel" in r.flags:
                wrong[problem.key] = (r.status, r.flags, r.correctness.get("dataflow"), (r.error or "")[:200])
    assert not wrong, wrong


def test_a_custom_op_whose_body_launches_a_kernel_is_the_kernels():
    # torch.library.custom_op around a Triton kernel: the dispatch mode sees one op with untainted inputs, and the
    # launch inside it; its result is the kernel's, not PyTorch's
    lib = torch.library.Library("kb_gym_dataflow_test", "FRAGMENT")  # noqa: TOR901 - a test's own namespace
    lib.define("affine(Tensor x) -> Tensor")
    current = {}

    def affine(x):
        out = torch.empty_like(x)
        return current["launch"]("affine", x, out, body=lambda a, o: o.copy_(a * 2 + 1))

    lib.impl("affine", affine, "CompositeExplicitAutograd")

    def forward(x, launch):
        current["launch"] = lambda *a, body: (launch(*a, body=body), a[-1])[1]
        return torch.ops.kb_gym_dataflow_test.affine(x)

    report = traced(forward)
    assert not pytorchs(report), report


def test_a_transpose_kernel_on_a_data_movement_problem_is_the_kernels():
    # the answer is the input's data moved: the kernel's copy of it, returned, is the work the problem asks for
    def forward(x, launch):
        out = torch.empty(x.shape[1], x.shape[0])
        launch("transpose", x.t(), out, body=lambda a, o: o.copy_(a))
        return out

    assert not pytorchs(traced(forward))


def test_pytorch_computing_on_a_kernels_transposed_input_is_pytorchs():
    def forward(x, launch):
        buf = torch.empty(x.shape[1], x.shape[0])
        launch("transpose", x.t(), buf, body=lambda a, o: o.copy_(a))
        return buf.t() * 2 + 1

    assert pytorchs(traced(forward))


def test_a_fill_is_no_answer_pytorch_computed():
    # an answer within the tolerance of zero everywhere (a softmax over a million columns) matches empty_like's
    # fresh zeros; a fill follows no input, so the kernel's answer stays the kernel's
    def forward(x, launch):
        out = torch.zeros_like(x)
        launch("tiny_softmax", x, out, body=lambda a, o: o.copy_(torch.softmax(a, dim=1) * 1e-7))
        return out

    assert not pytorchs(traced(forward))


def test_pytorchs_answer_copied_over_a_kernels_buffer_is_pytorchs():
    # copy_ overwrites its destination without reading it: what a kernel wrote there before is gone
    def forward(x, launch):
        out = torch.empty_like(x)
        launch("scribble", x, out, body=lambda a, o: o.copy_(a.sin()))
        out.copy_(x * 2 + 1)
        return out

    report = traced(forward)
    assert report["untainted"] == [0], report  # no kernel's work reaches it (not only: it matches PyTorch's result)


def test_a_sparse_result_is_followed_without_breaking_the_forward():
    def forward(x, launch):
        sparse = x.relu().to_sparse()
        dense = sparse.to_dense()
        out = torch.empty_like(dense)
        launch("affine", dense, out, body=lambda a, o: o.copy_(a * 2 + 1))
        return out

    report = traced(forward)
    assert not pytorchs(report), report


def test_taint_follows_a_sparse_round_trip():
    # a kernel's output through a sparse tensor and back is still the kernel's; PyTorch's answer through one is
    # still PyTorch's
    def kernel_first(x, launch):
        h = torch.empty_like(x)
        launch("relu", x, h, body=lambda a, o: o.copy_(a.relu()))
        return h.to_sparse().to_dense() * 2

    def pytorch_first(x, launch):
        y = (x.relu().to_sparse() * 2).to_dense()
        out = torch.empty_like(y)
        launch("copy", y, out, body=lambda a, o: o.copy_(a))
        return out

    assert not pytorchs(traced(kernel_first))
    assert pytorchs(traced(pytorch_first))


def test_pytorch_computing_in_place_on_a_kernels_copy_of_the_input_is_pytorchs():
    def forward(x, launch):
        buf = torch.empty_like(x)
        launch("copy_in", x, buf, body=lambda a, o: o.copy_(a))
        return buf.mul_(2).add_(1)

    report = traced(forward)
    assert report["untainted"] == [0], report


# --- work a kernel does and PyTorch undoes (round 14) ---------------------------------------------------------------

def _doubled(a, o, off=0.0):
    o.copy_(a * 2)
    o.view(-1)[0] += off  # ``off`` leaves the kernel's mark on one element: PyTorch's halving undoes the rest only


@pytest.mark.parametrize("shape", [(8, 16), (128, 64)], ids=["all_sampled", "sampled_then_whole"])
@pytest.mark.parametrize("undo", ["halved", "halved_in_place", "flipped_back", "mask_only"])
def test_a_result_exactly_an_untainted_tensor_is_pytorchs(undo, shape):
    def forward(x, launch):
        h = torch.empty_like(x)
        if undo == "flipped_back":
            launch("reverse", x, h, body=lambda a, o: o.copy_(a.flip(0, 1)))
            y = h.flip(0).flip(1)  # the first flip holds no value PyTorch has, the second is the input
        elif undo == "mask_only":
            launch("sin", x, h, body=lambda a, o: o.copy_(a.sin()))
            y = torch.where(h == h, x, h)  # the kernel's work only says "not NaN"
        else:
            launch("double", x, h, body=_doubled)
            y = h.mul_(0.5) if undo == "halved_in_place" else h * 0.5
        return y * 2.0 + 1.0

    report = traced(forward, shape=shape)
    assert pytorchs(report) and report["undone"] == 1, report


@pytest.mark.parametrize("shape", [(8, 16), (128, 64)], ids=["all_sampled", "sampled_then_whole"])
def test_a_result_one_element_off_an_untainted_tensor_stays_the_kernels(shape):
    def forward(x, launch):
        h = torch.empty_like(x)
        launch("double", x, h, body=lambda a, o: _doubled(a, o, off=1.0))
        return h * 0.5 * 2.0 + 1.0

    report = traced(forward, shape=shape)
    assert not pytorchs(report) and not report.get("undone"), report


def test_a_view_of_a_kernels_storage_equal_to_an_untainted_tensor_stays_the_kernels():
    # taint is per storage: the halved rows equal the input, but the spare row the kernel wrote shares their storage;
    # and a view op's result (the transposed copy viewed back) computes nothing, so it undoes nothing
    def in_place_on_part(x, launch):
        buf = torch.empty(x.shape[0] + 1, x.shape[1])
        launch("double_and_spare", x, buf, body=lambda a, o: o.copy_(torch.cat([a * 2, a[:1].sin()])))
        return buf[:-1].mul_(0.5) * 2.0 + 1.0

    def viewed_back(x, launch):
        h = torch.empty(x.shape[1], x.shape[0])
        launch("transpose", x, h, body=lambda a, o: o.copy_(a.t()))  # a copy of no live tensor: the kernel's
        return h.t() * 2.0 + 1.0

    for forward in (in_place_on_part, viewed_back):
        report = traced(forward)
        assert not pytorchs(report) and not report.get("undone"), (forward.__name__, report)


def test_past_the_undo_budget_a_result_stays_the_kernels(monkeypatch):
    monkeypatch.setattr("kb_gym.worker.dataflow.MAX_UNDO_VISITS", 0)

    def forward(x, launch):
        h = torch.empty_like(x)
        launch("double", x, h, body=_doubled)
        return h * 0.5 * 2.0 + 1.0

    report = traced(forward)
    assert not pytorchs(report) and report["undo_unchecked"] >= 1, report


def test_the_knockouts_wrong_share_counts_elements_off_by_more_than_the_relative_tolerance():
    """The knockout's sliver rule (correctness.SLIVER_SHARE) reads how much of the answer went wrong with the kernels
    skipped: relative tolerance only (a skipped kernel's zero-filled buffer on a problem of tiny values is wrong
    everywhere), NaN wrong where the reference has a number, integer outputs exactly; drawn chunks are not measured."""
    from kb_gym.worker.correctness import SLIVER_SHARE, wrong_share

    ref = torch.randn(64, 256) * 1e-6 + 1e-5  # no zeros: shares of every element
    one_off = ref.clone()
    one_off[3, 7] += 1.0
    assert wrong_share(one_off, ref, 1e-4) == 1 / ref.numel() < SLIVER_SHARE
    assert wrong_share(torch.zeros_like(ref), ref, 1e-4) == 1.0  # within any usual atol, yet all wrong
    with_nan = ref.clone()
    with_nan[0, :128] = float("nan")
    ints = torch.arange(100)
    assert wrong_share((with_nan, ints), (ref, ints), 1e-4) == 128 / ref.numel()
    # The largest share of any output: a kernel that made a whole scalar loss beside PyTorch's big tensor made it all.
    assert wrong_share((ref, torch.tensor(7.0)), (ref, torch.tensor(3.0)), 1e-4) == 1.0
    # Against the nonzero elements: a sparse answer (1 in 64 nonzero) over a zero fill is wrong wherever it is not 0.
    sparse = torch.zeros(64, 256)
    sparse[:, ::64] = 1.0
    assert wrong_share(torch.zeros_like(sparse), sparse, 1e-4) == 1.0
    assert wrong_share(torch.zeros(8), torch.zeros(8), 1e-4) == 0.0
    assert wrong_share(ref[:32], ref, 1e-4) is None and wrong_share((ref,), (ref, ref), 1e-4) is None
