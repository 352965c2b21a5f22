"""The launch counter's knockout (kb_gym/worker/launches.py): with it set, the candidate's own kernels do nothing,
so a forward that still answers right did not need them (``token_kernel``)."""

from __future__ import annotations

import types

import torch

from kb_gym.worker.launches import CountingModule, LaunchCounter


def _extension() -> types.ModuleType:
    """Stands in for a load_inline module: one function writes its output argument, two return results."""
    module = types.ModuleType("fake_ext")

    def scale_into(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x * 2)

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    def argmax_and_max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.argmax(dim=1), x.amax(dim=1)

    module.scale_into, module.scaled, module.argmax_and_max = scale_into, scaled, argmax_and_max
    return module


def test_an_extension_function_counts_and_runs_as_always_without_the_knockout():
    counter = LaunchCounter()
    ext = CountingModule(_extension(), counter)
    x, out = torch.arange(6.0).reshape(2, 3), torch.zeros(2, 3)
    ext.scale_into(x, out)
    assert torch.equal(out, x * 2) and torch.equal(ext.scaled(x), x * 2)
    assert counter.count == 2 and counter.backends == {"cuda"}


def test_the_knockout_loses_what_an_extension_writes_and_spoils_what_it_returns():
    counter = LaunchCounter()
    ext = CountingModule(_extension(), counter)
    x, out = torch.arange(6.0).reshape(2, 3), torch.zeros(2, 3)
    counter.knockout = True
    ext.scale_into(x, out)
    assert torch.equal(out, torch.zeros(2, 3)), "written into a copy"
    assert torch.isnan(ext.scaled(x)).all()
    wide = torch.randn(64, 1000)
    index, values = ext.argmax_and_max(wide)
    assert torch.isnan(values).all()
    # an index output left as computed would still be right: it is overwritten with random values
    assert index.dtype == torch.int64 and not torch.equal(index, wide.argmax(dim=1))
    assert counter.count == 3, "the calls still count"
    counter.knockout = False
    assert torch.equal(ext.scaled(x), x * 2)
