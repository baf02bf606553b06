"""tinytf.mixed_precision: gradient entries below fp16's range are counted as lost, loss scaling brings them back,
bf16 loses none; a bf16 copy of the weights drops the updates smaller than half its spacing."""

from __future__ import annotations

import torch
from torch import nn

from tinytf.mixed_precision import gradient_underflow, lost_updates


class _Tiny(nn.Module):
    """y = x · w with a loss whose gradient on w is exactly ``c · sum(x)`` per entry: known magnitudes."""

    def __init__(self):
        super().__init__()
        self.w = nn.Linear(4, 1, bias=False)

    def forward(self, x):
        return self.w(x)


def test_entries_below_fp16s_smallest_subnormal_are_counted_and_scaling_saves_them():
    model = _Tiny()
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    for c, lost in ((1e-3, 0), (1e-9, 4)):  # fp16's smallest subnormal is 6e-8: 1e-9 underflows in the backward
        u = gradient_underflow(model, lambda m, c=c: m(x).float().sum() * c, dtype=torch.float16, scale=2.0**16)
        assert (u.total, u.zero_fp32, u.lost, u.lost_scaled) == (4, 0, lost, 0), u
        assert u.dtype == "fp16" and (u.error == 1.0) == (lost == 4) and u.error_scaled < 1e-3
    assert all(p.grad is None for p in model.parameters())  # the model's grads are cleared afterwards
    bf16 = gradient_underflow(model, lambda m: m(x).float().sum() * 1e-9, dtype="bf16")
    assert bf16.lost == 0  # bf16 has fp32's range
    big = gradient_underflow(model, lambda m: m(x).sum() * 1e-3, dtype=torch.float16, scale=2.0**16)
    assert big.error_scaled == float("inf")  # an fp16 loss times 2**16 overflows: GradScaler would skip the step


def test_a_bf16_weight_copy_loses_small_updates():
    w = torch.full((4,), 1.0)
    updates = torch.tensor([1e-2, 1e-3, 4e-3, 0.0])  # bf16's spacing at 1.0 is 2**-7 = 0.0078
    lost, changed = lost_updates([w], [updates], torch.bfloat16)
    assert (lost, changed) == (1, 3)  # only 1e-3 is below half a spacing (0.0039); 4e-3 rounds up to the next step
