"""A pure-torch stand-in for the `sgl_kernel` package, so SGLang runs unmodified on a CPU.

`bench/setup_sglang_reference.sh` installs this file as `sgl_kernel/__init__.py` in SGLang's
own virtualenv. No CPU build of `sgl_kernel` exists as a wheel, and with SGLang's CPU engine on
(`SGLANG_USE_CPU_ENGINE=1`) and no AMX every compute operation (norms, activations, rotary,
attention) falls back to SGLang's own torch code; only the two operations below are reached.

Other names ending in `_cpu` are imported at module level by speculative decoding and mamba
code: they are callables that raise when called. Any other name is an `AttributeError`, so no
optional feature believes the kernels are there and turns on by accident.

It runs in SGLang's virtualenv only, never in the project's.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = ["assign_req_to_token_pool_cpu", "copy_all_layer_kv_cache_cpu"]


def assign_req_to_token_pool_cpu(
    req_pool_indices: Any,
    req_to_token: Any,
    start_offset: Any,
    end_offset: Any,
    out_cache_loc: Any,
    pool_len: int,
) -> None:
    """For each request r with [s, e), write the next e - s entries of `out_cache_loc` into
    `req_to_token[r, s:e]`, consuming `out_cache_loc` in order."""
    del pool_len  # the row length of `req_to_token`, which torch knows already
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        length = end - start
        if length <= 0:
            continue
        req_to_token[row, start:end] = out_cache_loc[taken : taken + length].to(req_to_token.dtype)
        taken += length


def copy_all_layer_kv_cache_cpu(data_ptrs: Any, strides: Any, tgt_loc: Any, src_loc: Any) -> None:
    """For every buffer i (base address `data_ptrs[i]`, rows of `strides[i]` bytes), copy row
    `src_loc[j]` to row `tgt_loc[j]`: one memmove per row, as the C++ kernel does."""
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist(), strict=True))
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        for target, source in pairs:
            if target != source:
                ctypes.memmove(base + target * stride, base + source * stride, stride)


def _missing(name: str) -> Callable[..., NoReturn]:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not provided by the pure-torch stand-in (CPU, no AMX)"
        )

    refuse.__name__ = name
    return refuse


def __getattr__(name: str) -> Any:
    if name.endswith("_cpu") and not name.startswith("_"):
        return _missing(name)
    raise AttributeError(f"module 'sgl_kernel' has no attribute {name!r}")
