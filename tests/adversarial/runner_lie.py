"""What rounds 20-22 share: round 4's time lie, run from whatever module table a candidate reached, on an honest
Triton GELU, and how much a program's static findings cost it under ``strict``.

The lie (``LIE``) expects ``_modules`` (the runner's ``sys.modules``) bound before it: it finds the runner's module,
makes its ``timed_call`` run eager GELU and report 1 us, and its ``LaunchCounter.reset`` leave a count of 1, while the
trials, the knockout and the dataflow stage run the honest kernel (``GELU_KERNEL``: 0.03x on this CPU's interpreter).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from test_judge_isolation import TIMED

from kb_gym.integrity import get_policy, static_findings

STRICT = get_policy("strict")
RANK = {"none": 0, "no_speed_credit": 1, "reject": 2}
STRICT_TIMED = TIMED.replace(integrity="strict", load_timeout=240)

HEADER = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n"
GELU_KERNEL = '''
@triton.jit
def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476)), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        gelu_kernel[(triton.cdiv(n, 16384),)](x, out, n, BLOCK=16384)
        return out
'''
LIE = '''
_runner = [m for m in list(_modules.values()) if "Runner" in vars(m) and "timed_call" in vars(m)][0]
_real = _runner.timed_call


def _eager(x):
    return torch.nn.functional.gelu(x)


def _one_microsecond(fn, inputs, device, flusher, *a, **k):
    return _real(_eager, inputs, device, flusher, *a, **k)._replace(ms=1e-3, host_ms=1e-3)


_runner.timed_call = _one_microsecond
_reset = _runner.LaunchCounter.reset


def _reset_to_one(self):
    _reset(self)
    self.count = 1


_runner.LaunchCounter.reset = _reset_to_one
'''


def cost(source: str) -> str:
    """What ``strict`` makes the source's findings cost: ``reject``, ``no_speed_credit`` or ``none``."""
    findings = static_findings(source)
    if STRICT.rejections(findings):
        return "reject"
    return "no_speed_credit" if STRICT.speed_credit_denied(findings) else "none"


def sound(r) -> bool:
    """Rejected, or no speed credit, or no speedup it did not earn (the honest kernel: 0.03x on the CPU)."""
    return r.status == "rejected" or not r.speed_credit or (r.speedup or 0.0) < 2.0


def reach(routes: dict[str, tuple[str, str, str]], namespace: str = "{'torch': torch}") -> dict[str, bool | str]:
    """Which routes get what they aim at (``name -> (prelude, probe, least)``), run in one fresh interpreter (the
    runner's is one too): the probe's truth, or the error the prelude raised."""
    code = ["import builtins, importlib, json, sys", "import torch", "import torch.nn", "done = {}"]
    for name, (prelude, probe, _) in routes.items():
        code.append(f"ns = {namespace}\ntry:\n    exec({prelude!r}, ns)\n"
                    f"    done[{name!r}] = bool(eval({probe!r}, {{**globals(), **ns}}))\n"
                    f"except Exception as exc:\n    done[{name!r}] = repr(exc)")
    code.append("print(json.dumps(done))")
    out = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
