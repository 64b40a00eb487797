"""Test models: the package's GPT-2-style transformer."""

from outcore.torch.models import TinyGPT, lm_loss

__all__ = ["TinyGPT", "lm_loss"]
