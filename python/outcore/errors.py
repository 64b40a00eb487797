"""Exceptions raised by outcore.

Every error of the Rust facade arrives as one of these classes, chosen by the
facade's error kind, with the facade's message unchanged (it names the value,
the accepted range and the fix).
"""

from __future__ import annotations


class OutcoreError(Exception):
    """Base class of every outcore error."""


class InvalidValueError(OutcoreError, ValueError):
    """A value outside what is accepted: a budget, size, name or setting."""


class GraphError(OutcoreError, ValueError):
    """A graph that cannot be built, read or validated."""


class PlanError(OutcoreError):
    """A plan that cannot be read, fails verification, or cannot run."""


class InfeasibleError(OutcoreError):
    """No plan fits the budget (a value, not a bug: the message says by how much)."""


class OutcoreIOError(OutcoreError, OSError):
    """A file that cannot be read or written."""


class UnsupportedOpError(OutcoreError, ValueError):
    """A captured PyTorch op that outcore.torch cannot plan or run."""


class CaptureError(OutcoreError, ValueError):
    """A training step that cannot be captured (model, loss, optimizer or batch)."""


__all__ = [
    "OutcoreError",
    "InvalidValueError",
    "GraphError",
    "PlanError",
    "InfeasibleError",
    "OutcoreIOError",
    "UnsupportedOpError",
    "CaptureError",
]
