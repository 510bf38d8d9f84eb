"""How long one forward step of the emulated engine takes: an H100 serving a 32B model.

The numbers are estimates, derived from the hardware's published limits and the usual
efficiency of serving stacks, not measurements; docs/ENGINE.md gives the reasoning. In short:

* Prefill is compute bound. A 32B dense model spends about 2 x 32e9 = 64 GFLOP per token; an
  H100 SXM peaks near 990 TFLOP/s in dense BF16 and prefill kernels reach roughly 60% of that,
  so one uncached prompt token costs about 0.1 ms. Each prefill step also pays a fixed few
  milliseconds (scheduling, kernel launches, sampling).
* Decode is memory bound. Every step reads all weights (about 64 GB in BF16) at about
  3.35 TB/s, 19 ms at the bandwidth limit and 25 ms at a realistic 75%, plus the KV cache of
  every running request: with 64 layers, 8 KV heads of 128 dimensions in BF16, a token's KV is
  256 KiB, about 0.08 us at that bandwidth. A batch holding the whole 23k-token cache adds
  about 2 ms: 25-27 ms per step.

Attention's quadratic term is left out: at the prompt lengths of the paper (up to ~4k tokens) it
is under 10% of prefill time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["CostModel"]


@dataclass(frozen=True, slots=True)
class CostModel:
    """Seconds spent by one prefill step and one decode step (see the module docstring)."""

    prefill_seconds_per_token: float = 1.0e-4
    prefill_seconds_per_step: float = 5.0e-3
    decode_seconds_per_step: float = 25.0e-3
    decode_seconds_per_context_token: float = 8.0e-8

    def __post_init__(self) -> None:
        for name in (
            "prefill_seconds_per_token",
            "prefill_seconds_per_step",
            "decode_seconds_per_step",
            "decode_seconds_per_context_token",
        ):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")

    def prefill_time(self, uncached_tokens: int, steps: int = 1) -> float:
        """Seconds to prefill `uncached_tokens` new tokens in `steps` forward passes."""
        return steps * self.prefill_seconds_per_step + uncached_tokens * (
            self.prefill_seconds_per_token
        )

    def decode_time(self, context_tokens: int) -> float:
        """Seconds for one decode step whose running requests hold `context_tokens` of KV."""
        return self.decode_seconds_per_step + context_tokens * self.decode_seconds_per_context_token
