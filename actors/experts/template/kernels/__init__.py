"""The template expert's core kernel kinds, one module each: each registers its
:class:`~actors.experts.template.kernel_kinds.KernelTemplate` when imported
(``kernel_kinds.load_kinds`` imports every module here); the renderer and the tuner never import
one by name. A family whose kernel is its own registers it in its family module instead."""
