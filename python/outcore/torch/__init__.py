"""outcore for PyTorch: plan a real training step and run it under a budget.

>>> import torch, torchvision, outcore.torch as ot             # doctest: +SKIP
>>> model = torchvision.models.resnet18().cuda()
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
>>> step = ot.compile_step(model, torch.nn.functional.cross_entropy, opt,
...                        (x, y), budget="8GiB")   # planner="outcore"
>>> loss = step(x, y)                # one step: forward, backward, optimizer

On CUDA the step plans by default for PyTorch's expandable segments
(``allocator="virtual-chunks"``, which it turns on), issues the plan's steps in
its simulated order (``issue_order="timeline"``) and keeps 12% of the budget
for kernels' workspaces: far below eager training's peak (a quarter of it for
ResNet-50 on an H200) that is the setting that trained (RESULTS.md, "Issue
order" and "Why planned steps ran out of memory").

Modules: ``capture`` (make_fx on fake tensors of the model's device),
``convert`` (outcore's graph and recomputability decisions), ``codegen``
(straight-line code from a plan), ``runtime`` (streams, pinned host buffers,
the step function), ``bench`` (``python -m outcore.torch.bench``),
``allochistory`` (PyTorch's allocator history as an outcore trace, for the
device diagnostics).
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
