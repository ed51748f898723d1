"""What a TRL worker measures inside `Trainer.train()`: step times, the peak live tensor bytes of one extra step,
and the shape of every collated batch.

The callbacks sit where transformers 5.24's loop calls them (transformers/trainer.py): the batches of an optimizer
step are fetched first (get_batch_samples, :1881), then `on_step_begin` (:1902), the micro-batches' forwards and
backwards, `optimizer.step()` (:1943), `model.zero_grad()` (:1954), `on_step_end` (:1957). So:
- a step's time is the interval between consecutive `on_step_end`s (taken after a barrier on every rank): fetching
  and collating its batches, forward(s), backward, optimizer: the whole step as a user's run pays it;
- memory: the last step runs under torch.profiler(profile_memory=True) from `on_step_begin` to `on_step_end`; the
  peak is the live tensor bytes at `on_step_begin` (gc scan, collect.tensors.live_tensor_bytes: parameters,
  optimizer state, the fetched batch; gradients already freed) plus the running maximum of the allocator's
  allocations minus frees during the step (shared/notes/cpu-measurement.md: exact, repeats across runs).
  On a GPU (device "cuda") the same step's peak is torch.cuda.max_memory_allocated() after a reset at its begin
  (the caching allocator's own count of live tensor bytes, its maximum over the step), and every stamp waits for
  the device (torch.cuda.synchronize) so a step's time is its kernels', not their launches'."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from perfpredict.collect.tensors import live_tensor_bytes
from perfpredict.collect.trl.trainers import forwards_of


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def peak_from_profile(prof: Any) -> tuple[int, int]:
    """(running maximum, final value) of bytes allocated minus freed, over the profiler's allocation events in
    time order. The final value checks the peak: the live bytes at the step's end should be the live bytes at its
    start plus it (frees of blocks allocated before the profiler started carry no size and are dropped: they
    would show as end < start + final)."""
    from torch._C._profiler import _EventType

    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    events.sort()
    cur = peak = 0
    for _, size in events:
        cur += size
        peak = max(peak, cur)
    return peak, cur


class StepProbe(TrainerCallback):
    """Barrier-stamped step ends; the profiled last step's peak live tensor bytes."""

    def __init__(self, total_steps: int, *, profile_last: bool = True, memtracker: bool = False,
                 device: str = "cpu") -> None:
        self.total_steps = total_steps
        self.cuda = device == "cuda"
        self.reserved_bytes: int | None = None  # cuda: max_memory_reserved over the profiled step
        self.run_peak_bytes: int | None = None  # cuda: max_memory_allocated from construction to the profiled step
        self._cuda_step = False
        self.profile_last = profile_last
        self.memtracker = memtracker  # cross-check: torch's MemTracker on the same step instead of the profiler
        self.tracker_bytes: int | None = None
        self.net_bytes: int | None = None
        self.end_bytes: int | None = None
        self._mt: Any = None
        self.ends: list[float] = []
        self.base_bytes: int | None = None
        self.during_bytes: int | None = None
        self.rss_bytes: int | None = None
        self._prof: Any = None

    def _stamp(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        _barrier()
        self.ends.append(time.perf_counter())

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._stamp()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.profile_last and state.global_step == self.total_steps - 1 and self.cuda:
            torch.cuda.synchronize()
            self.run_peak_bytes = torch.cuda.max_memory_allocated()
            self.base_bytes = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            self._cuda_step = True
        elif self.profile_last and state.global_step == self.total_steps - 1 and self.memtracker:
            from torch.distributed._tools.mem_tracker import MemTracker

            self.base_bytes = live_tensor_bytes("cpu")
            self._mt = MemTracker()
            self._mt.track_external(*(x for x in (kw.get("model"), kw.get("optimizer")) if x is not None))
            self._mt.__enter__()
        elif self.profile_last and state.global_step == self.total_steps - 1:
            from torch.profiler import ProfilerActivity, profile

            self.base_bytes = live_tensor_bytes("cpu")
            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
            self._prof.__enter__()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._cuda_step:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            self.during_bytes = peak - (self.base_bytes or 0)
            self.end_bytes = torch.cuda.memory_allocated()
            self.net_bytes = self.end_bytes - (self.base_bytes or 0)
            self.reserved_bytes = torch.cuda.max_memory_reserved()
            self.run_peak_bytes = max(self.run_peak_bytes or 0, peak)
            self._cuda_step = False
        if self._mt is not None:
            self._mt.__exit__(None, None, None)
            snap = self._mt.get_tracker_snapshot("peak")
            self.tracker_bytes = max(int(v.get("Total", 0)) for v in snap.values()) if snap else None
            self._mt = None
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            self.during_bytes, self.net_bytes = peak_from_profile(self._prof)
            self._prof = None
            self.end_bytes = live_tensor_bytes("cpu")
            try:
                import psutil

                self.rss_bytes = psutil.Process().memory_info().rss
            except ImportError:
                self.rss_bytes = None
        self._stamp()

    def step_times(self, warmup: int, steps: int) -> list[float]:
        """Intervals of steps warmup+1 .. warmup+steps (ends[0] is the train start, ends[k] the end of step k)."""
        diffs = [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)]
        return diffs[warmup:warmup + steps]

    @property
    def peak_bytes(self) -> int | None:
        if self.base_bytes is None or self.during_bytes is None:
            return None
        return self.base_bytes + self.during_bytes


class BatchRecorder:
    """Wraps a trainer's data collator; keeps (rows, padded length, real tokens, scored tokens) of every forward."""

    def __init__(self) -> None:
        self.forwards: list[tuple[int, int, int, int]] = []
        self.shapes: set[tuple[int, ...]] = set()

    def wrap(self, collate: Any) -> Any:
        def recorded(examples: list[dict[str, Any]]) -> Any:
            batch = collate(examples)
            fw = forwards_of(batch)
            self.forwards.extend(fw)
            self.shapes.update((r, t) for r, t, _, _ in fw)
            return batch

        return recorded

    def summary(self, forwards_per_batch: int) -> dict[str, Any]:
        if not self.forwards:
            return {}
        n = len(self.forwards) / max(forwards_per_batch, 1)
        rows = sum(f[0] for f in self.forwards) / n
        return {"batch_rows": rows, "padded_len_mean": sum(f[1] for f in self.forwards) / len(self.forwards),
                "padded_len_max": max(f[1] for f in self.forwards),
                "padded_len_min": min(f[1] for f in self.forwards),
                "padded_tokens_mean": sum(f[0] * f[1] for f in self.forwards) / n,
                "real_tokens_mean": sum(f[2] for f in self.forwards) / n,
                "completion_tokens_mean": sum(f[3] for f in self.forwards) / n,
                "batches_seen": int(n), "batch_shapes": sorted(self.shapes)}
