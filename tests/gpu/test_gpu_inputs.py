"""Widened inputs on a real GPU (kb_gym/worker/inputs.py): drawn once the problem's own input is gone, in
``randn_like``'s layout from a meta copy, they are ``randn_like(x) * 3`` bit for bit on the CUDA generator too, and the
draw holds one input's worth of memory, not three (docs/benchmarks.md 1o).

Run on the device machine by scripts/gpu_check.sh; skipped elsewhere (tests/conftest.py).
"""

from __future__ import annotations

import types

import pytest
import torch

from kb_gym.worker.inputs import make_inputs, seed_all

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
LAYOUTS = {
    "contiguous": lambda: [torch.rand(256, 1024)],
    "transposed": lambda: [torch.rand(1024, 256).t()],
    "channels_last": lambda: [torch.rand(8, 16, 32, 32).to(memory_format=torch.channels_last)],
    "two and an integer": lambda: [torch.rand(64, 64), torch.randint(0, 9, (8,)), torch.rand(3)],
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_widened_inputs_are_randn_like_times_three_on_the_device(layout):
    module = types.SimpleNamespace(get_inputs=LAYOUTS[layout])
    got = make_inputs(module, 11, CUDA, torch.float32, widen=True)
    seed_all(11)
    with torch.device(CUDA):
        own = LAYOUTS[layout]()
    want = [torch.randn_like(x) * 3 if x.is_floating_point() else x for x in own]
    for g, w in zip(got, want, strict=True):
        assert g.device.type == "cuda" and g.stride() == w.stride() and torch.equal(g, w)


def test_the_widened_draw_holds_one_input_at_a_time():
    n = 64 << 20  # 256 MB of fp32
    module = types.SimpleNamespace(get_inputs=lambda: [torch.rand(n)])
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    inputs = make_inputs(module, 3, CUDA, torch.float32, widen=True)
    peak = torch.cuda.max_memory_allocated() - before
    assert inputs[0].numel() == n
    # the problem's input, then the draw in its place: one input's worth (4 n bytes) at the peak, not two or three
    assert peak <= 4 * n * 1.05, peak / (4 * n)
