"""The host side of a rendered ``ModelNew``'s launches: each launch site's compiled kernel kept.

``fn[grid](*args, **constexprs)`` goes through Triton's JIT on every call: it binds the
arguments, specialises each one, builds the cache key and reads its settings before the kernel
reaches the driver. On an H200 machine's host a level-3 model's 159 launches that way took 8 ms
a forward for 0.8 ms of GPU work (KernelBench L3-9, ResNet18 at batch 2; eager PyTorch took
3.4 ms, torch.compile 2.9 ms): whole models are bound by their launches' host time.

A site's first launch goes through the JIT as usual and keeps the ``CompiledKernel`` it returns;
later launches call that kernel's launcher directly, as PyTorch's Inductor does, while what the
JIT specialised on still holds: the same device, tensors only, each of the same dtype and
16-byte aligned (Triton specialises pointers on that). Anything else goes through the JIT
again. Nothing but the compiled kernel is kept: no tensor, no weights, no outputs. The launcher
takes the arguments the JIT bound in the kernel's order (constexprs too where the kernel's
signature lists them, Triton 3.3 on; before, only the others). Under Triton's interpreter the
JIT returns no compiled kernel, so every launch goes through it.
"""

from __future__ import annotations

LAUNCHER_SOURCE = '''

def _kf_stream(device):
    """(device index, raw stream) of this forward's launches; None off CUDA."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return index, torch.cuda.current_stream(index).cuda_stream


class _KfLaunch:
    """One launch site: its first launch through triton.jit, later ones straight to the compiled
    kernel it returned while the JIT's specialisation holds (same device, dtypes, alignment)."""

    __slots__ = ("fn", "grid", "kw", "ck", "where", "dtypes", "consts")

    def __init__(self, fn, grid, **kw):
        self.fn = fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.kw = kw
        self.ck = None
        self.where = None
        self.dtypes = ()
        self.consts = ()

    def __call__(self, stream, *args):
        ck = self.ck
        if ck is not None and stream is not None and stream[0] == self.where:
            for a, dtype in zip(args, self.dtypes):
                if a.dtype is not dtype or a.data_ptr() & 15:
                    break
            else:
                g = self.grid
                ck.run(g[0], g[1], g[2], stream[1], ck.function, ck.packed_metadata, None, None, None,
                       *args, *self.consts)
                return
        kernel = self.fn[self.grid](*args, **self.kw)
        if ck is None and stream is not None and self.where is None:
            self._keep(kernel, stream[0], args)

    def _keep(self, kernel, where, args):
        self.where = -1  # tried once: from here on only a kept kernel launches directly
        if not all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata", "src")):
            return
        if not all(isinstance(a, torch.Tensor) and not a.data_ptr() & 15 for a in args):
            return
        names = list(self.fn.arg_names)
        listed = {names[k] if isinstance(k, int) else k for k in kernel.src.signature}
        rest = names[len(args):]
        if any(n not in self.kw for n in rest) or any(n not in listed for n in names[:len(args)]):
            return
        self.consts = tuple(self.kw[n] for n in rest if n in listed)
        self.dtypes = tuple(a.dtype for a in args)
        self.ck, self.where = kernel, where
'''
"""Module-level source of the launcher a rendered file's ``forward`` calls (``_KfLaunch``)."""
