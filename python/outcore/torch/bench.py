"""Benchmark: the largest batch and the throughput of four ways to train under
one memory budget, found by bisection.

    python -m outcore.torch.bench --model resnet50 --budget 8GiB --json out.json

Methods: ``eager`` (plain PyTorch), ``checkpoint`` (``torch.utils.checkpoint``
around every block: ResNet bottlenecks, transformer blocks), ``save_on_cpu``
(``torch.autograd.graph.save_on_cpu(pin_memory=True)``), and ``outcore``
(:func:`outcore.torch.compile_step` with the chosen planner).  The budget is
enforced for every method alike with
``torch.cuda.set_per_process_memory_fraction(budget / device memory)``; a
batch "fits" when a warm-up step and the timed steps run without running out
of memory (for outcore: also when a plan is found).  All methods train with
SGD (momentum 0.9) in float32.

Search: the batch doubles from ``--start`` until it fails, then bisects until
the bracket is within ``--tolerance`` of the lower end.  With ``--batch N`` there
is no search: every method trains at batch N once (the throughput of each way
at one batch, e.g. against eager training under an unlimited budget).  Throughput is the
median of ``--iters`` timed steps at the largest batch, in samples per second.
For outcore, the simulated iteration time of the plan is reported beside the
measured one.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Callable

import torch
from torch import nn

from .models import TinyGPT, lm_loss
from .runtime import is_out_of_memory


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cleanup(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        # pinned host blocks stay cached by PyTorch's host allocator otherwise,
        # and the next trial would find less host memory than the machine has
        host_empty = getattr(torch._C, "_host_emptyCache", None)
        if host_empty is not None:
            host_empty()


def make_model(name: str, device: torch.device) -> tuple[nn.Module, Callable, Callable[[int], tuple]]:
    """(model, loss, batch maker) of a benchmark model."""
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50().to(device)

        def batch(b: int):
            return (torch.randn(b, 3, 224, 224, device=device), torch.randint(0, 1000, (b,), device=device))

        return model, nn.functional.cross_entropy, batch
    if name == "gpt2":
        model = TinyGPT.gpt2_124m().to(device)

        def batch(b: int):
            return (torch.randint(0, 50257, (b, 1024), device=device), torch.randint(0, 50257, (b, 1024), device=device))

        return model, lm_loss, batch
    if name == "tiny-gpt":  # for a quick run on CPU
        model = TinyGPT(vocab=128, d=32, heads=2, layers=2, seq=32, p=0.1).to(device)

        def batch(b: int):
            return (torch.randint(0, 128, (b, 32), device=device), torch.randint(0, 128, (b, 32), device=device))

        return model, lm_loss, batch
    raise SystemExit(f"error: unknown model `{name}`; choose resnet50, gpt2 or tiny-gpt")


def _blocks(model: nn.Module) -> list[nn.Module]:
    if isinstance(model, TinyGPT):
        return list(model.h)
    out = []
    for name in ("layer1", "layer2", "layer3", "layer4"):
        seq = getattr(model, name, None)
        if seq is not None:
            out.extend(list(seq))
    return out


def _checkpoint_blocks(model: nn.Module) -> None:
    from torch.utils.checkpoint import checkpoint

    for blk in _blocks(model):
        fwd = blk.forward
        blk.forward = lambda *a, _f=fwd: checkpoint(_f, *a, use_reentrant=False)  # type: ignore[method-assign]


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def _init_state(model, loss_fn, opt, make_batch) -> None:
    """One eager step at batch 1 so that the optimizer has its state (its
    shapes do not depend on the batch), then the parameters as they were."""
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    opt.zero_grad()
    x, y = make_batch(1)
    loss_fn(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.load_state_dict(saved)


def prepared(model_name: str, device: torch.device, batch: int):
    """A benchmark model with SGD's state created (:func:`_init_state`) and one
    batch: (model, loss, optimizer, x, y), for the device tools."""
    model, loss_fn, make_batch = make_model(model_name, device)
    opt = _sgd(model)
    _init_state(model, loss_fn, opt, make_batch)
    x, y = make_batch(batch)
    return model, loss_fn, opt, x, y


def run_trial(method: str, model_name: str, batch: int, budget_bytes: int, device: torch.device,
              iters: int, planner: str, headroom: float | None, seconds: float = 10.0,
              allocator: str | None = None, issue_order: str | None = None,
              moves: int | None = None, alloc_history: str | None = None) -> dict[str, Any] | None:
    """Trains ``iters`` timed steps (after one warm-up); ``None`` if it does not fit.
    ``alloc_history``: a folder where, on CUDA, the caching allocator's record
    of the whole trial is written (:mod:`outcore.torch.allochistory`)."""
    args = (method, model_name, batch, budget_bytes, device, iters, planner, headroom, seconds, allocator,
            issue_order, moves)
    if alloc_history is None or device.type != "cuda":
        return _run_trial(*args)
    from .allochistory import recorded

    os.makedirs(alloc_history, exist_ok=True)
    name = f"{method}-{planner}-b{batch}" if method == "outcore" else f"{method}-b{batch}"
    with recorded(os.path.join(alloc_history, name), budget_bytes, device):
        return _run_trial(*args)


def _run_trial(method: str, model_name: str, batch: int, budget_bytes: int, device: torch.device,
               iters: int, planner: str, headroom: float | None, seconds: float, allocator: str | None,
               issue_order: str | None,
               moves: int | None) -> dict[str, Any] | None:
    model, loss_fn, make_batch = make_model(model_name, device)
    opt = _sgd(model)
    step: Callable[[torch.Tensor, torch.Tensor], Any]
    info: dict[str, Any] = {}
    compiled = None
    try:
        _init_state(model, loss_fn, opt, make_batch)
        if method == "checkpoint":
            _checkpoint_blocks(model)
        if method in ("eager", "checkpoint"):
            def step(x, y):
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                return loss
        elif method == "save_on_cpu":
            def step(x, y):
                opt.zero_grad(set_to_none=True)
                with torch.autograd.graph.save_on_cpu(pin_memory=True):
                    loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                return loss
        elif method == "outcore":
            import outcore.torch as ot

            t0 = time.perf_counter()
            compiled = ot.compile_step(model, loss_fn, opt, make_batch(batch), budget=budget_bytes,
                                       planner=planner, headroom=headroom, enforce=True,
                                       time_limit_s=seconds, allocator=allocator, issue_order=issue_order,
                                       moves=moves)
            info["compile_s"] = time.perf_counter() - t0
            info["planner"] = compiled.plan_result.planner
            info["simulated_iter_s"] = compiled.plan_result.report.iter_time_s
            info["plan_peak_live_bytes"] = compiled.plan_result.report.peak_live_bytes
            info["planner_budget_bytes"] = compiled.compiled.planner_budget_bytes
            # the step's settings, its device's defaults where none was given
            info.update(allocator=compiled.allocator, issue_order=compiled.issue_order,
                        headroom=compiled.headroom)
            g = compiled.compiled.generated
            info.update(recomputes=g.n_recomputes, swap_outs=g.n_swap_outs, swap_ins=g.n_swap_ins)
            step = compiled
        else:
            raise SystemExit(f"error: unknown method `{method}`")
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), device)
            torch.cuda.reset_peak_memory_stats(device)
        step(*make_batch(batch))
        times = []
        for _ in range(iters):
            x, y = make_batch(batch)  # one batch resident at a time, as in training
            _sync(device)
            t0 = time.perf_counter()
            step(x, y)
            _sync(device)
            times.append(time.perf_counter() - t0)
            del x, y
        t = statistics.median(times)
        out = {"method": method, "batch": batch, "iter_s": t, "samples_per_s": batch / t, **info}
        if device.type == "cuda":
            out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
            out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
        if method == "outcore":
            out["relative_error"] = abs(info["simulated_iter_s"] - t) / t
        return out
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if is_out_of_memory(e):
            # what ran out, and (outcore) what the plan predicted: the log is
            # all a later reader has to tell fragmentation from an unplanned buffer
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            predicted = ""
            if "simulated_iter_s" in info:
                predicted = (f" (plan: {info['planner']}, {info['recomputes']} recomputes, {info['swap_outs']} "
                             f"swap-outs, peak {info['plan_peak_live_bytes']} B of {info['planner_budget_bytes']} B)")
            where = getattr(compiled, "last_failure", None)
            if where is not None:  # the plan step the generated code failed in
                info["failed_at"] = str(where)
                predicted += f" at {where.what}"
            print(f"  {method} b={batch}: out of memory{predicted}: {first[:300]}", file=sys.stderr)
            FAILURES.append({"method": method, "batch": batch, "error": first[:1000], **info})
            return None
        raise
    except Exception as e:  # noqa: BLE001 - outcore's "no plan at this batch"; any other error propagates
        from outcore.errors import InfeasibleError

        if isinstance(e, InfeasibleError):
            print(f"  {method} b={batch}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
            return None
        raise
    finally:
        del model, opt
        _cleanup(device)


#: device bytes per sample of eager training (its peak over its largest batch)
EAGER_BYTES_PER_SAMPLE: list[int] = []

#: every trial that fitted (outcore's give simulated vs measured time per plan)
TRIALS: list[dict[str, Any]] = []

#: every trial that ran out of device memory: the error and, for outcore, the plan
FAILURES: list[dict[str, Any]] = []


def largest_batch(method: str, args, budget_bytes: int, device: torch.device, start: int) -> dict[str, Any] | None:
    """Doubling, then bisection; the best trial's result."""
    def trial(b: int):
        if method == "save_on_cpu" and EAGER_BYTES_PER_SAMPLE:
            from .runtime import available_host_bytes

            avail = available_host_bytes()
            need = EAGER_BYTES_PER_SAMPLE[0] * b
            if avail is not None and need > 0.6 * avail:
                # save_on_cpu pins every saved activation on the host; past
                # this the machine (not the device budget) runs out first
                print(f"  {method:12s} batch {b:5d}: does not fit (about {need / 2**30:.0f} GiB of pinned "
                      f"host memory, {avail / 2**30:.0f} GiB available)", file=sys.stderr, flush=True)
                return None
        r = run_trial(method, args.model, b, budget_bytes, device, args.iters, args.planner, args.headroom,
                      args.seconds, args.allocator, args.issue_order, args.moves, args.alloc_history)
        if r is not None:
            TRIALS.append(r)
        print(f"  {method:12s} batch {b:5d}: {'fits' if r else 'does not fit'}"
              + (f" ({r['samples_per_s']:.1f} samples/s)" if r else ""), file=sys.stderr, flush=True)
        return r

    if args.batch:
        return trial(args.batch)
    best = None
    b = start
    fail = None
    while b <= args.max_batch:
        r = trial(b)
        if r is None:
            fail = b
            break
        best = r
        b *= 2
    if best is None:
        lo, hi = 0, start
        while hi - lo > 1:
            mid = (lo + hi) // 2
            r = trial(mid)
            if r:
                best, lo = r, mid
            else:
                hi = mid
        return best
    if fail is None:
        return best
    lo, hi = best["batch"], fail
    while hi - lo > max(1, int(lo * args.tolerance)):
        mid = (lo + hi) // 2
        r = trial(mid)
        if r:
            best, lo = r, mid
        else:
            hi = mid
    return best


METHODS = ("eager", "checkpoint", "save_on_cpu", "outcore")
MODELS = ("resnet50", "gpt2", "tiny-gpt")


def _checked(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Refuses every out-of-range argument by name before anything runs
    (``ap.error``: the usage, the message, exit status 2); returns the
    budget in bytes."""
    import outcore

    if args.model not in MODELS:
        ap.error(f"--model: unknown model `{args.model}`; accepted: {', '.join(MODELS)}")
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        ap.error(f"--methods: unknown method `{unknown[0]}`; accepted, comma-separated: {', '.join(METHODS)}")
    known = outcore.planners(by_name_too=True)
    if args.planner != "auto" and args.planner not in known:
        ap.error(f"--planner: unknown planner `{args.planner}`; accepted: auto, {', '.join(known)}")
    if args.batch < 0:
        ap.error(f"--batch must be >= 1 (or 0 for the search); got {args.batch}")
    if args.start < 1:
        ap.error(f"--start must be a whole number >= 1 (the first batch the search tries), e.g. 8; got {args.start}")
    if args.max_batch < args.start:
        ap.error(f"--max-batch must be at least --start ({args.start}); got {args.max_batch}")
    if args.iters < 1:
        ap.error(f"--iters must be a whole number >= 1 (timed steps per trial), e.g. 3; got {args.iters}")
    if args.headroom is not None and not (math.isfinite(args.headroom) and 0 <= args.headroom < 1):
        ap.error(f"--headroom must be a fraction of the budget in [0, 1), e.g. 0.08; got {args.headroom}")
    if not (math.isfinite(args.tolerance) and 0 < args.tolerance < 1):
        ap.error(f"--tolerance must be a fraction in (0, 1), e.g. 0.2; got {args.tolerance}")
    if args.eager_bytes_per_sample < 0:
        ap.error(f"--eager-bytes-per-sample must be >= 0 bytes; got {args.eager_bytes_per_sample}")
    if not (math.isfinite(args.seconds) and args.seconds > 0):
        ap.error(f"--seconds must be a positive number of seconds, e.g. 10; got {args.seconds}")
    if args.moves is not None:
        if args.moves < 0:
            ap.error(f"--moves must be a whole number >= 0 (scored moves per start), e.g. 2000; got {args.moves}")
        if args.planner not in ("outcore", "outcore-recompute"):
            ap.error(f"--moves bounds the search of --planner outcore or outcore-recompute; `{args.planner}` "
                     "counts no moves: give one of those, or leave --moves out")
        if "outcore" not in args.methods.split(","):
            ap.error(f"--moves applies to the outcore method, which --methods `{args.methods}` does not include")
    try:
        budget_bytes = int(args.budget) if args.budget.isdigit() else outcore.parse_size(args.budget)
    except outcore.OutcoreError as e:
        ap.error(f"--budget: {e}")
    if budget_bytes <= 0:
        ap.error(f"--budget must be a positive number of bytes or a size such as 8GiB; got `{args.budget}`")
    return budget_bytes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50", help="resnet50, gpt2 (124M) or tiny-gpt")
    ap.add_argument("--budget", required=True, help="bytes or a size such as 8GiB")
    ap.add_argument("--methods", default="eager,checkpoint,save_on_cpu,outcore")
    ap.add_argument("--planner", default="outcore", help="outcore planner name, or auto")
    ap.add_argument("--headroom", type=float, default=None,
                    help="fraction of the budget kept from the planner (default: compile_step's for the device, "
                         "0.12 on CUDA)")
    ap.add_argument("--start", type=int, default=8, help="first batch tried")
    ap.add_argument("--max-batch", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=0, help="train every method at this batch only (no search)")
    ap.add_argument("--issue-order", default=None, choices=["early", "timeline"],
                    help="how outcore's generated code orders the plan's steps (compile_step's issue_order; "
                         "default: its default for the device, timeline on CUDA)")
    ap.add_argument("--allocator", default=None,
                    choices=["best-fit", "best-fit-paged", "virtual-chunks", "perfect"],
                    help="the allocator outcore plans for: best-fit, best-fit-paged (segments on any free "
                         "pages, as cudaMalloc maps them), virtual-chunks (turns on PyTorch's expandable "
                         "segments for the rest of the process: give it one method, or outcore last) or "
                         "perfect (default: compile_step's for the device, virtual-chunks on CUDA)")
    ap.add_argument("--seconds", type=float, default=10.0, help="outcore's planning time limit per trial")
    ap.add_argument("--moves", type=int, default=None,
                    help="bound the outcore planner's search by scored moves per start instead of the clock, "
                         "so that a trial plans the same on any machine (compile_step's moves; planners "
                         "outcore and outcore-recompute only)")
    ap.add_argument("--alloc-history", default=None, metavar="DIR",
                    help="on CUDA, write the caching allocator's record of each trial into DIR as an outcore "
                         "allocation trace (`outcore alloc-replay` replays it) and its segment events")
    ap.add_argument("--tolerance", type=float, default=0.2, help="bisection stops within this fraction")
    ap.add_argument("--iters", type=int, default=3, help="timed steps per trial")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--eager-bytes-per-sample", type=int, default=0,
                    help="device bytes per sample of eager training, when eager is not among the methods "
                         "(bounds save_on_cpu's pinned host memory)")
    args = ap.parse_args(argv)
    budget_bytes = _checked(ap, args)

    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    results = []
    start = args.start
    if args.eager_bytes_per_sample:
        EAGER_BYTES_PER_SAMPLE.append(args.eager_bytes_per_sample)
    for method in args.methods.split(","):
        r = largest_batch(method, args, budget_bytes, device, start)
        results.append(r or {"method": method, "batch": 0})
        if method == "eager" and r:
            start = max(1, r["batch"])
            if r.get("peak_allocated_bytes"):
                EAGER_BYTES_PER_SAMPLE.append(r["peak_allocated_bytes"] // r["batch"])
        if args.json:  # after every method, so that a cut-off run keeps what it found
            with open(args.json, "w") as f:
                json.dump({"model": args.model, "budget_bytes": budget_bytes, "partial": True,
                           "results": results, "trials": TRIALS, "failures": FAILURES}, f, indent=1)
    doc = {
        "planner": args.planner, "headroom": args.headroom, "seconds": args.seconds, "moves": args.moves,
        "allocator": args.allocator, "issue_order": args.issue_order, "fixed_batch": args.batch,
        "model": args.model, "budget_bytes": budget_bytes, "device": torch.cuda.get_device_name(device)
        if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "results": results,
        "trials": TRIALS, "failures": FAILURES,
    }
    print(f"\n{args.model}, budget {args.budget} ({budget_bytes} B) on {doc['device']}")
    print(f"{'method':12s} {'batch' if args.batch else 'max batch':>9s} {'samples/s':>10s} {'iter ms':>9s} {'peak alloc MiB':>15s}  notes")
    for r in results:
        if not r.get("batch"):
            print(f"{r['method']:12s} {'0':>9s} {'-':>10s} {'-':>9s} {'-':>15s}")
            continue
        notes = ""
        if r["method"] == "outcore":
            notes = (f"{r['planner']}, simulated {r['simulated_iter_s'] * 1e3:.1f} ms "
                     f"(|sim-meas|/meas {r['relative_error']:.2f}), {r['recomputes']} recomputes, "
                     f"{r['swap_outs']} swap-outs")
        print(f"{r['method']:12s} {r['batch']:9d} {r['samples_per_s']:10.1f} {r['iter_s'] * 1e3:9.1f} "
              f"{r.get('peak_allocated_bytes', 0) / 2**20:15.0f}  {notes}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
