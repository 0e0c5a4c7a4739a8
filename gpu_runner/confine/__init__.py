"""Confinement of worker processes by the kernel: namespaces, a filesystem view, Landlock, seccomp.

Each layer is a module with one job, used only inside forked or launched workers (no structlog,
no torch): :mod:`namespaces` (user, network, IPC, PID and mount namespaces, entered at spawn),
:mod:`fsview` (the mount namespace's read-only, hidden-home view, applied before the candidate),
:mod:`landlock` (a whitelist of paths), :mod:`seccomp` (a system-call filter) and :mod:`caps`
(dropping privileges). :mod:`probe` finds which layers this kernel grants, once per service, and
:mod:`policy` (the evaluator's side) turns that into the plan each worker receives.
"""
