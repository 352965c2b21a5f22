"""The device the adversarial suite's judges and runners use: ``KB_GYM_ADVERSARIAL_DEVICE``, ``cpu`` by default.

``scripts/gpu_check.sh adversarial`` sets ``cuda:0``: one GPU run then gives every attack its verdict from a CUDA
judge and CUDA runners. Candidates build their tensors where their inputs are (``device=x.device``); the few tests
whose attack exists only on the CPU skip where ``ON_GPU``, saying why.
"""

from __future__ import annotations

import os

DEVICE = os.environ.get("KB_GYM_ADVERSARIAL_DEVICE", "cpu")
ON_GPU = DEVICE.startswith("cuda")
