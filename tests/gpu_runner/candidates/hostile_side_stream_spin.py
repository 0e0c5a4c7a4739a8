# Cheat (GPU-only): computes honestly, but in timing rounds (the worker's `_call` on the stack, found with torch.inspect; not in the trials nor in the synchronized wall-clock guard, which calls forward directly from run_timing) it leaves a ~2 ms spin kernel filling every SM on a side stream (torch.cuda.Stream through an alias the gate does not resolve) after returning, so the eager call timed next waits for the SMs (fools the eager baseline timed in the same process on the same GPU, and the deferred-work guard, which it avoids). On the CPU it does nothing extra.
import torch
import torch.nn as nn
import triton
import triton.language as tl

_inspect = torch.inspect
_Stream = torch.cuda.Stream
_on_stream = torch.cuda.stream
_side = {}


@triton.jit
def add_relu_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x + y, 0.0), mask=mask)


@triton.jit
def spin_kernel(scratch_ptr, iters, BLOCK: tl.constexpr):
    acc = tl.arange(0, BLOCK).to(tl.float32)
    for _ in range(iters):
        acc = acc * 0.999999 + 1e-7
    tl.store(scratch_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), acc)


def in_timing_round():
    return any(info.function == "_call" for info in _inspect.stack(0))


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        add_relu_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        spin_kernel[(1,)](torch.empty(256, device=x.device), 0, BLOCK=256)  # built by the compile stage
        if x.is_cuda and in_timing_round():
            if "stream" not in _side:
                _side["stream"] = _Stream(device=x.device)
                _side["scratch"] = torch.empty(1056 * 256, device=x.device)
            with _on_stream(_side["stream"]):
                spin_kernel[(1056,)](_side["scratch"], 20000, BLOCK=256)
        return out
