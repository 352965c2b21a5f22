"""The float64 second opinion's sampled rounding (kb_gym/worker/float64.py: rounding_spread, judge) on a real GPU: the
nearby inputs drawn on the device, the CUDA generator's state left as it was, each element held to its own scale
(round 33's wrong small rows ``incorrect``, honest summation orders ``correct``), and with the float64 answer pushed to
the host (the device's memory full) the samples taken there (round 35).

Run on the device machine by scripts/gpu_check.sh; skipped elsewhere (tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch

from kb_gym.worker import float64

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


class RowSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1)


def _mixed(seed: int) -> torch.Tensor:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    x = torch.randn(65536, 64, device=CUDA, generator=g)
    x[:32768] *= 1e5
    return x


def _wrong_small_rows(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    exact = x.double().sum(1)
    out = exact.float()
    worst = float((ref.double() - exact).abs().max())
    small = (x.abs().amax(dim=1) < 100.0).nonzero().flatten()[:48]
    out[small] += 2.5 * worst
    return out


def test_the_rounding_is_sampled_on_the_device_and_leaves_its_generator_as_it_was():
    model = RowSum()
    x = _mixed(0)
    ref = model(x)
    result, state = {"flags": []}, {}
    exact = float64.float64_answer(CUDA, model, [x], ref, result, state)
    before = torch.cuda.get_rng_state(CUDA)
    spreads = float64.rounding_spread(CUDA, model, [x], ref, exact, 1e-4, 1e-4, result, state)
    assert spreads is not None, result
    assert "float64_spread_error" not in result["correctness"]
    assert torch.equal(torch.cuda.get_rng_state(CUDA), before)
    spread = spreads[0]
    assert spread.scale.device.type == "cuda" and spread.scale.shape == (65536,)
    assert spread.scale[32768:].max() < 1e-3 < spread.scale[:32768].max()


@pytest.mark.parametrize("where", ["device", "host"])
def test_wrong_small_rows_are_incorrect_and_honest_orders_correct(monkeypatch, where):
    if where == "host":  # the float64 forward does not fit beside what the runner holds: the opinion goes to the host
        real = float64._in_float64

        def device_full(ref_model, args, at):
            if at.type == "cuda":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
            return real(ref_model, args, at)

        monkeypatch.setattr(float64, "_in_float64", device_full)
    model = RowSum()
    for seed in range(3):
        x = _mixed(seed)
        ref = model(x)
        state: dict = {}
        wrong = float64.judge(CUDA, model, [x], _wrong_small_rows(x, ref), ref, 1e-4, 1e-4, {"flags": []}, state)
        assert not wrong.ok, (where, seed)
        assert state.get("float64_on_host", "device") == ("cpu" if where == "host" else "device")
        for honest in (x.view(x.shape[0], 4, -1).sum(2).sum(1), x.flip(1).sum(1), x.double().sum(1).float()):
            result: dict = {"flags": []}
            verdict = float64.judge(CUDA, model, [x], honest, ref, 1e-4, 1e-4, result, state)
            assert verdict.ok, (where, seed, verdict.reason, result)
