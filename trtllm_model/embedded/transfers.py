"""Host-to-device copies that do not wait for the device.

A plain copy from pageable host memory to a CUDA device waits for everything queued on the stream before it, so one
small index tensor made with `torch.tensor(..., device="cuda")` would make the engine wait for the step it just
launched (and lose the overlap of its steps, engine.py). Through pinned memory the copy is queued on the stream like
a kernel (torch keeps the pinned block until the copy is done).
"""

from __future__ import annotations

import torch


def to_device(data: torch.Tensor | list, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`data` (a host tensor or a list) on `device`, without waiting for the device."""
    tensor = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=dtype)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
