"""What the training workers (our harness and the TRL worker) read from torch about memory: the live tensor bytes
on a device, and whether an exception was the allocator running out."""

from __future__ import annotations

import gc
import warnings

import torch


def is_oom(e: BaseException) -> bool:
    if isinstance(e, torch.OutOfMemoryError):
        return True
    msg = str(e).lower()
    return "out of memory" in msg or "can't allocate memory" in msg or "cannot allocate memory" in msg


def live_tensor_bytes(device_type: str) -> int:
    """Bytes of every distinct tensor storage reachable from Python on the device (DTensors by their local
    shard)."""
    from torch.distributed.tensor import DTensor

    gc.collect()
    seen: set[int] = set()
    total = 0
    with warnings.catch_warnings():  # isinstance() on some module objects trips deprecation warnings
        warnings.simplefilter("ignore")
        objs = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for o in objs:
        try:
            t = o._local_tensor if isinstance(o, DTensor) else o
            if t.device.type != device_type or t.is_meta:
                continue
            st = t.untyped_storage()
            ptr = st.data_ptr()
        except Exception:  # noqa: BLE001 - wrapper subclasses without storage, fake tensors
            continue
        if ptr == 0 or ptr in seen:
            continue
        seen.add(ptr)
        total += st.nbytes()
    return total
