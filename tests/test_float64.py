"""The judge's float64 second opinion (worker/float64.py): where it is computed and what it leaves behind."""

from __future__ import annotations

import pytest
import torch

from kb_gym.worker import float64


class Scaled(torch.nn.Module):
    """A reference that also changes its integer input in place, as a forward may."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(64, 64))
        self.register_buffer("shift", torch.randn(64))

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        counts.add_(1)
        return torch.softmax(x @ self.weight + self.shift, dim=-1)


def _case():
    torch.manual_seed(0)
    model = Scaled()
    x, counts = torch.randn(32, 64), torch.zeros(4, dtype=torch.int64)
    with torch.no_grad():
        ref_out = model(x.clone(), counts.clone())
    return model, [x, counts], ref_out


def _exact(model, inputs):
    with torch.no_grad():
        return torch.softmax(inputs[0].double() @ model.weight.double() + model.shift.double(), dim=-1)


def test_an_answer_out_of_the_devices_memory_is_computed_on_the_host(monkeypatch):
    model, inputs, ref_out = _case()
    weight, storage, shift = model.weight, model.weight.data_ptr(), model.shift
    tried = []
    real = float64._in_float64

    def device_full(ref_model, args, where):
        tried.append(where.type)
        if where.type == "cuda":  # the device's memory does not hold the float64 model and answer
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB")
        return real(ref_model, args, where)

    monkeypatch.setattr(float64, "_in_float64", device_full)
    result, state = {"flags": []}, {}
    answer = float64.float64_answer(torch.device("cuda"), model, inputs, ref_out, result, state)
    assert tried == ["cuda", "cpu"]
    assert result["correctness"]["float64_on"] == "cpu" and not state.get("float64_failed")
    assert answer[0].dtype == torch.float32 and answer[0].device == ref_out.device
    torch.testing.assert_close(answer[0], _exact(model, inputs).float(), atol=1e-7, rtol=1e-6)
    # the model is the judge's again: the same Parameter on its own fp32 tensor, the buffer fp32
    assert model.weight is weight and model.weight.data_ptr() == storage and model.shift is shift
    assert model.weight.dtype == model.shift.dtype == torch.float32 == torch.get_default_dtype()
    assert inputs[1].tolist() == [0, 0, 0, 0] and inputs[0].dtype == torch.float32  # copies took the change
    again = float64.float64_answer(torch.device("cuda"), model, inputs, ref_out, result, state)
    assert tried == ["cuda", "cpu", "cpu"]  # the job's next trial does not try the device again
    torch.testing.assert_close(again[0], answer[0])


@pytest.mark.parametrize("error", [RuntimeError("a kernel of its own"), torch.OutOfMemoryError("host memory")])
def test_a_reference_that_cannot_run_in_float64_gets_no_second_opinion(monkeypatch, error):
    """Any failure on the host (out of memory there too) leaves the first verdict standing, once per job."""
    model, inputs, ref_out = _case()

    def fails(ref_model, args, where):
        raise error

    monkeypatch.setattr(float64, "_in_float64", fails)
    result, state = {"flags": []}, {}
    assert float64.float64_answer(torch.device("cpu"), model, inputs, ref_out, result, state) is None
    assert state["float64_failed"] and str(error) in result["correctness"]["float64_error"]
    assert "float64_on" not in result["correctness"]


def test_the_answer_on_the_judges_device_matches_float64():
    model, inputs, ref_out = _case()
    result = {"flags": []}
    answer = float64.float64_answer(torch.device("cpu"), model, inputs, ref_out, result, {})
    torch.testing.assert_close(answer[0], _exact(model, inputs).float(), atol=1e-7, rtol=1e-6)
    assert "float64_on" not in result.get("correctness", {}) and model.weight.dtype == torch.float32


# --- the reference's own rounding, sampled on nearby inputs (rounding_spread) ----------------------------------------

class BatchStats(torch.nn.Module):
    """A reference that updates state in place as it runs (a BatchNorm in training mode) and draws numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x).sum(dim=1) + 0 * torch.rand(1)


def test_sampling_the_references_rounding_leaves_the_judges_model_inputs_and_draws_as_they_were():
    torch.manual_seed(0)
    model = BatchStats()
    x = 100 * torch.randn(256, 64)
    kept_x, stats = x.clone(), [t.clone() for t in model.norm._buffers.values()]
    with torch.no_grad():
        ref_out = model(x)
    stats = [t.clone() for t in model.norm._buffers.values()]
    exact = float64.float64_answer(torch.device("cpu"), model, [x], ref_out, {"flags": []}, {})
    before = torch.random.get_rng_state()
    result, state = {"flags": []}, {}
    spreads = float64.rounding_spread(torch.device("cpu"), model, [x], ref_out, exact, 1e-4, 1e-4, result, state)
    assert spreads is not None and result["correctness"]["float64_sampled"] == 1
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(x, kept_x)
    assert all(torch.equal(a, b) for a, b in zip(model.norm._buffers.values(), stats, strict=True))
    assert model.norm.weight.dtype == torch.float32 and model.training
    spread = spreads[0]
    assert spread.scale.shape == (256,) and spread.worst == float(spread.scale.max())
    assert spread.worst > 0 and spread.l2 > 0


class MixedRows(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1)


def test_each_element_gets_its_own_rounding_scale():
    """Rows of two scales: the small rows' scale is the small rows' rounding, not the large rows' (round 33)."""
    torch.manual_seed(0)
    x = torch.cat([1e5 * torch.randn(512, 64), torch.randn(512, 64)])
    model = MixedRows()
    ref_out = model(x)
    exact = [x.double().sum(1).float()]
    spread = float64.rounding_spread(torch.device("cpu"), model, [x], ref_out, exact, 1e-4, 1e-4, {"flags": []},
                                     {})[0]
    assert spread.scale[:512].max() > 1e-3 and spread.scale[512:].max() < 1e-4
    assert spread.worst == float(spread.scale[:512].max())


def test_a_reference_that_fails_on_a_nearby_input_leaves_the_whole_output_bound(monkeypatch):
    """Where the sampling fails, the opinion falls back to the input alone, and the job does not try again."""
    model, inputs, ref_out = _case()
    exact = float64.float64_answer(torch.device("cpu"), model, inputs, ref_out, {"flags": []}, {})

    def fails(ref_model, args, where):
        raise RuntimeError("only integers in this input")

    monkeypatch.setattr(float64, "_in_own_precision", fails)
    result, state = {"flags": []}, {}
    assert float64.rounding_spread(torch.device("cpu"), model, inputs, ref_out, exact, 1e-4, 1e-4, result,
                                   state) is None
    assert state["spread_failed"] == "reference"
    assert "only integers" in result["correctness"]["float64_spread_error"]
    assert float64.rounding_spread(torch.device("cpu"), model, inputs, ref_out, exact, 1e-4, 1e-4, result,
                                   state) is None  # once per job
    assert inputs[1].tolist() == [0, 0, 0, 0]


def _drawn(out: torch.Tensor, firsts: list[int], n: int):
    from kb_gym.worker.spot_check import SampledOutputs

    meta = [{"shape": list(out.shape), "dtype": str(out.dtype).removeprefix("torch.")}]
    return SampledOutputs(meta, [(0, first, out.reshape(-1)[first:first + n].clone()) for first in firsts])


def test_drawn_chunks_get_the_float64_opinion_with_one_allowance_per_output():
    """Spot-checked timed outputs: an exact answer where the reference is off passes; small rows moved by the large
    rows' rounding fail, spread over four chunks of three rows each (the chunks of an output are judged together)."""
    torch.manual_seed(0)
    x = torch.cat([1e5 * torch.randn(2048, 64), torch.randn(2048, 64)])[torch.randperm(4096)]
    model = MixedRows()
    ref_out = model(x)
    exact = x.double().sum(1).float()
    firsts = [0, 1024, 2048, 3072]
    honest = float64.judge_chunks(torch.device("cpu"), model, [x], ref_out, _drawn(exact, firsts, 512), 1e-4, 1e-4,
                                  {"flags": []}, {})
    assert honest.ok
    wrong = exact.clone()
    worst = float((ref_out.double() - exact.double()).abs().max())
    small = [i for i in range(4096) if x[i].abs().max() < 100]
    for first in firsts:  # three small rows in each drawn chunk
        for i in [i for i in small if first <= i < first + 512][:3]:
            wrong[i] += 2.5 * worst
    result = {"flags": []}
    verdict = float64.judge_chunks(torch.device("cpu"), model, [x], ref_out, _drawn(wrong, firsts, 512), 1e-4, 1e-4,
                                   result, {})
    assert not verdict.ok and "against a float64 computation" in verdict.reason, verdict.reason
    assert result["correctness"]["judged_against_float64"] == 1


class RowSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(1)


def _variants(x: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor) -> dict[str, torch.Tensor]:
    """Honest orders of a cancelling row sum, and answers moved on a few rows by multiples of the reference's own
    largest error: both sides of the per-element and whole-output bounds."""
    worst = float((ref.double() - exact.double()).abs().max())
    out = {"sequential": x.cumsum(1)[:, -1], "reversed": x.flip(1).cumsum(1)[:, -1],
           "tiles_of_16": x.view(x.shape[0], -1, 16).sum(2).sum(1), "float64": exact.clone()}
    for k in (0.5, 2.0, 4.0, 60.0):
        for rows in (1, 5, 40):
            moved = exact.clone()
            moved[:rows] += k * worst
            out[f"{rows}_rows_by_{k}x"] = moved
    return out


def test_a_pass_on_this_inputs_rounding_alone_is_a_pass_of_the_sampled_opinion(monkeypatch):
    """The check on this input's rounding (no nearby inputs run) passes only what the sampled opinion passes, and
    passes every honest order of the cancelling row sums: there it saves six forwards a narrow miss."""
    model = RowSum()
    quick = sampled = disagree = 0
    for seed in range(4):
        x = 1000 * torch.randn(4096, 64, generator=torch.Generator().manual_seed(seed))
        ref = model(x)
        exact = x.double().sum(1).float()
        for name, cand in _variants(x, ref, exact).items():
            fast = {"flags": []}
            verdict = float64.judge(torch.device("cpu"), model, [x], cand, ref, 1e-4, 1e-4, fast, {})
            if "judged_against_float64" not in fast.get("correctness", {}):
                continue  # not a narrow miss, or the reference exact here: no opinion either way
            with monkeypatch.context() as m:
                m.setattr(float64, "_this_input_only", lambda *a, **k: None)
                full = {"flags": []}
                again = float64.judge(torch.device("cpu"), model, [x], cand, ref, 1e-4, 1e-4, full, {})
            assert full["correctness"].get("float64_sampled") == 1 and "float64_quick" not in full["correctness"]
            quick += fast["correctness"].get("float64_quick", 0)
            sampled += fast["correctness"].get("float64_sampled", 0)
            disagree += verdict.ok != again.ok
            if fast["correctness"].get("float64_quick"):
                assert verdict.ok and again.ok, (seed, name)
            if name in ("sequential", "reversed", "tiles_of_16", "float64"):
                assert verdict.ok, (seed, name, verdict.reason)
    assert disagree == 0
    assert quick >= 8 and sampled >= 4, (quick, sampled)  # both paths were taken


def test_the_quick_pass_is_not_taken_beside_trivial_outputs():
    """In the trials, zeros, the inputs and other answers are held to the same test (``unverifiable``), which the
    samples loosen: there the sampled opinion always runs."""
    model = RowSum()
    x = 1000 * torch.randn(4096, 64, generator=torch.Generator().manual_seed(1))
    ref = model(x)
    cand = x.flip(1).cumsum(1)[:, -1]
    result = {"flags": []}
    verdict = float64.judge(torch.device("cpu"), model, [x], cand, ref, 1e-4, 1e-4, result, {},
                            [torch.zeros_like(ref)])
    assert verdict.ok and result["correctness"].get("float64_sampled") == 1
    assert "float64_quick" not in result["correctness"]


def test_drawn_chunks_take_the_quick_pass_too():
    model = RowSum()
    quick = 0
    for seed in range(8):
        x = 1000 * torch.randn(4096, 64, generator=torch.Generator().manual_seed(seed))
        ref = model(x)
        result = {"flags": []}
        honest = x.flip(1).cumsum(1)[:, -1]
        verdict = float64.judge_chunks(torch.device("cpu"), model, [x], ref, _drawn(honest, [0, 2048], 2048), 1e-4,
                                       1e-4, result, {})
        assert verdict.ok, (seed, verdict.reason)
        quick += result.get("correctness", {}).get("float64_quick", 0)
    assert quick, "no drawn chunks missed narrowly"
