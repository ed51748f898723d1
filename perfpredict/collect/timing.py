"""Timing helpers, and the CPU noise checks from shared/notes/cpu-measurement.md.

- `measure(fn)`: warm-up, then repeat until the coefficient of variation is small or a time cap is reached; the
  median is the label (robust to the 1.2-2x stretches seen on the shared CPUs), the CV its spread. On GPU each repeat
  is bracketed by CUDA events (no host jitter); on CPU by perf_counter_ns (the work is synchronous there).
- `calibrate()`: a fixed single-thread workload. Its time before and after a run, over the session's baseline,
  tells whether the machine was slowed meanwhile (frequency, a neighbour on the core), which the run cannot see.
- `LoadSampler`: CPU used by *other* processes while a run is going on: total busy time from /proc/stat (or psutil)
  minus the CPU time of our own process tree (our own + waited-for children via getrusage, which includes the
  torchrun workers once torchrun has reaped them). It also reports the hypervisor's steal time on its own
  (`steal_cores`, also part of the busy time above): steal is a slow-down no guest-side wait can avoid, and
  keeping it apart tells it from the calibration's other slow-downs (on the 2-core development hosts, 1.2-1.3x stretches mostly came
  with steal near 0)."""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from perfpredict.core.gates import OTHER_LOAD_MAX_CORES


@dataclass(frozen=True)
class Timing:
    median_s: float
    cv: float
    repeats: int
    times_s: tuple[float, ...]


def cv_of(xs: list[float] | tuple[float, ...]) -> float:
    if len(xs) < 2:
        return 0.0
    mean = statistics.fmean(xs)
    return statistics.pstdev(xs) / mean if mean > 0 else 0.0


def summarize(xs: list[float]) -> Timing:
    return Timing(median_s=statistics.median(xs), cv=cv_of(xs), repeats=len(xs), times_s=tuple(xs))


def _sync(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn: Callable[[], object], *, device: torch.device | str | None = None, warmup: int = 2,
            min_repeats: int = 5, max_repeats: int = 50, cv_target: float = 0.03,
            time_cap_s: float = 1.0) -> Timing:
    """Median time of fn() over repeats. Stops after max_repeats, or once min_repeats are in and either the CV is
    below cv_target or time_cap_s has been spent (a slow op gets min_repeats, never fewer)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    cuda = device is not None and torch.device(device).type == "cuda"
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_repeats:
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter_ns()
            fn()
            _sync(device)
            times.append((time.perf_counter_ns() - t0) / 1e9)
        if len(times) >= min_repeats:
            if cv_of(times) < cv_target or time.perf_counter() - start > time_cap_s:
                break
    return summarize(times)


# --- calibration -----------------------------------------------------------------------------------------------
_CALIB_N = 384


def calibrate(*, rounds: int = 5, inner: int = 40) -> float:
    """Seconds for a fixed workload on one thread (fp32 384^3 GEMMs plus an elementwise pass, ~40 ms a round on
    the CPUs the notes describe: long enough that timer and scheduler jitter stay ~1%); the min of `rounds` so one
    interruption doesn't count."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(_CALIB_N, _CALIB_N, generator=g)
        b = torch.randn(_CALIB_N, _CALIB_N, generator=g)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            c = a
            for _ in range(inner):
                c = torch.tanh(c @ b * 0.01)
            best = min(best, (time.perf_counter_ns() - t0) / 1e9)
        return best
    finally:
        torch.set_num_threads(prev)


def calibration_baseline(*, samples: int = 5, pause_s: float = 0.2) -> float:
    """The machine's undisturbed calibration time: the minimum over a few spaced samples."""
    best = float("inf")
    for i in range(samples):
        best = min(best, calibrate())
        if i + 1 < samples:
            time.sleep(pause_s)
    return best


# --- load from other processes ----------------------------------------------------------------------------------
def _busy_cpu_s() -> float:
    """Total non-idle CPU seconds of the machine since boot."""
    try:
        import psutil

        t = psutil.cpu_times()
        return float(t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
                     + getattr(t, "steal", 0))
    except ImportError:
        with open("/proc/stat") as f:
            parts = f.readline().split()[1:]
        vals = [int(x) for x in parts]
        # user nice system idle iowait irq softirq steal ...
        busy = vals[0] + vals[1] + vals[2] + vals[5] + vals[6] + (vals[7] if len(vals) > 7 else 0)
        return busy / os.sysconf("SC_CLK_TCK")


def _steal_cpu_s() -> float:
    """CPU seconds the hypervisor gave to other guests while ours were runnable (0 where not reported)."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()[1:]
        return int(parts[7]) / os.sysconf("SC_CLK_TCK") if len(parts) > 7 else 0.0
    except (OSError, ValueError):
        return 0.0


def cores_over(cpu_s: float, wall_s: float) -> float:
    """CPU seconds spent over a wall interval, as cores, bounded to [0, this machine's CPUs].

    /proc/stat counts in clock ticks (10 ms): over a window of a few ms one tick reads as several cores, more
    than the machine has; no reading can exceed the CPUs there are."""
    return min(max(cpu_s, 0.0) / max(wall_s, 1e-6), float(os.cpu_count() or 1))


def _own_cpu_s() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class LoadSampler:
    """Average CPU (in cores) used by processes outside our tree between start() and stop().

    Only valid when the children we launch are waited for before stop() (their CPU time reaches RUSAGE_CHILDREN
    then). Also keeps 1-s samples of total machine load, for a log."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.total_samples: list[float] = []
        self.steal_cores = 0.0

    def start(self) -> LoadSampler:
        self._t0 = time.monotonic()
        self._steal0 = _steal_cpu_s()
        self._busy0 = _busy_cpu_s()
        self._own0 = _own_cpu_s()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        last_t, last_b = time.monotonic(), _busy_cpu_s()
        while not self._stop.wait(self.interval_s):
            t, b = time.monotonic(), _busy_cpu_s()
            if t > last_t:
                self.total_samples.append((b - last_b) / (t - last_t))
            last_t, last_b = t, b

    def stop(self) -> float:
        self._stop.set()
        if self._thread:
            self._thread.join()
        wall = max(time.monotonic() - self._t0, 1e-6)
        self.steal_cores = cores_over(_steal_cpu_s() - self._steal0, wall)
        return cores_over((_busy_cpu_s() - self._busy0) - (_own_cpu_s() - self._own0), wall)


def wait_quiet(*, max_wait_s: float, window_s: float = 2.0, threshold: float = OTHER_LOAD_MAX_CORES) -> float:
    """Wait (at most max_wait_s) until other processes use < threshold cores over a window; returns that load.

    Called between runs, when none of our children is running, so the machine's busy time minus our own is the
    others'. Waiting for a quiet spell before a retry makes the retry worth its time on a shared machine."""
    deadline = time.monotonic() + max_wait_s
    while True:
        s = LoadSampler(interval_s=window_s).start()
        time.sleep(window_s)
        load = s.stop()
        if load < threshold or time.monotonic() >= deadline:
            return load
