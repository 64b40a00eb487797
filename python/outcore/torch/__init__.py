"""outcore for PyTorch: plan a real training step and run it under a budget.

>>> import torch, torchvision, outcore.torch as ot             # doctest: +SKIP
>>> model = torchvision.models.resnet18().cuda()
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
>>> step = ot.compile_step(model, torch.nn.functional.cross_entropy, opt,
...                        (x, y), budget="8GiB")   # planner="outcore"
>>> loss = step(x, y)                # one step: forward, backward, optimizer

Far below eager training's peak (a quarter of it for ResNet-50 on an H200),
``compile_step(..., issue_order="timeline", allocator="virtual-chunks",
headroom=0.12)`` is the setting that trained (0.12 and 0.15 tried; RESULTS.md,
"Issue order").

Modules: ``capture`` (make_fx on fake tensors of the model's device),
``convert`` (outcore's graph and recomputability decisions), ``codegen``
(straight-line code from a plan), ``runtime`` (streams, pinned host buffers,
the step function), ``bench`` (``python -m outcore.torch.bench``).
"""

from __future__ import annotations

from ..errors import CaptureError, InfeasibleError, InvalidValueError, PlanError, UnsupportedOpError
from .runtime import StepFunction, compile_step, parse_budget

__all__ = [
    "compile_step",
    "StepFunction",
    "parse_budget",
    "CaptureError",
    "UnsupportedOpError",
    "InfeasibleError",
    "InvalidValueError",
    "PlanError",
]
