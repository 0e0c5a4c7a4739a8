"""Code that runs in the sandboxed worker processes, on the far side of the trust boundary.

Everything here runs in a worker: a run worker imports a candidate (``candidate``), a compile
worker builds one (``compiling``); the reference (``reference``, ``measure``) and the judge
(``judging``) run in workers that never import a candidate. The parent never imports these
modules; it reads what they send through :mod:`gpu_runner.frames`. Only the stdlib, numpy,
psutil, torch and triton are imported here.
"""
