"""The reference file the CPU executor's kernels are held to
(`crates/exec/tests/data/torch_kernel_refs.json`, checked by
`crates/exec/tests/torch_reference.rs`) is PyTorch's: every case is
recomputed here from its stored inputs with the installed PyTorch, and the
generator's cases are the file's, so a case added to the generator without
writing the file again, or a hand-edited number, fails here."""

import importlib.util
import json
import os

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
REFS = os.path.join(ROOT, "crates", "exec", "tests", "data", "torch_kernel_refs.json")


def _generator():
    path = os.path.join(ROOT, "tools", "torch_kernel_refs.py")
    spec = importlib.util.spec_from_file_location("torch_kernel_refs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
with open(REFS) as f:
    DOC = json.load(f)


def _close(got: torch.Tensor, stored: dict, what: str):
    want = GEN._from(stored)
    assert list(got.shape) == stored["shape"], what
    if want.dtype == torch.int64:
        assert torch.equal(got, want), what
    else:
        # Stored values are PyTorch's f32 results; another PyTorch build
        # may round a sum differently by an ulp or two.
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, msg=what)


@pytest.mark.parametrize("case", DOC["cases"], ids=[c["name"] for c in DOC["cases"]])
def test_each_case_is_what_pytorch_computes_from_its_inputs(case):
    outputs, grads = GEN.reference(case)
    assert len(outputs) == len(case["outputs"])
    for k, (got, stored) in enumerate(zip(outputs, case["outputs"])):
        _close(got, stored, f"{case['name']}: output {k}")
    if case.get("grad_output") is None:
        assert grads is None
        return
    for k, (got, stored) in enumerate(zip(grads, case["grads"])):
        assert (got is None) == (stored is None), f"{case['name']}: gradient {k}"
        if got is not None:
            _close(got, stored, f"{case['name']}: gradient {k}")


def test_the_file_has_the_generators_cases():
    fresh = GEN.generate(0)
    assert DOC["format"] == fresh["format"]
    assert [c["name"] for c in DOC["cases"]] == [c["name"] for c in fresh["cases"]]
    for old, new in zip(DOC["cases"], fresh["cases"]):
        assert (old["kind"], old["attrs"], old["step"]) == (new["kind"], new["attrs"], new["step"])


def test_a_wrong_function_is_told_apart():
    """The comparison can fail: GELU's tanh approximation, what the CPU
    kernel computed before, is not within its tolerance of the stored
    (erf) GELU."""
    case = next(c for c in DOC["cases"] if c["kind"] == "gelu")
    x = GEN._from(case["inputs"][0])
    with pytest.raises(AssertionError):
        _close(torch.nn.functional.gelu(x, approximate="tanh"), case["outputs"][0], "tanh gelu")
