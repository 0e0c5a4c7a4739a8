"""The offline template expert: reads a reference's FX graph and writes real Triton kernels.

Pure building blocks (no network, no event loop): :func:`analyse` traces a KernelBench-format
reference into a :class:`Plan` (or :class:`Unsupported`), :func:`render` writes the standalone
``ModelNew`` source for a plan and :class:`TemplateParams`, :func:`default_params` and
:func:`mutate` move through the parameter space, and :func:`params_from_source` reads a rendered
source's header back. ``TemplateExpert`` (``actors.experts.template.expert``) serves them as an
``Expert``.
"""

from actors.experts.template.ir import Plan, Unsupported
from actors.experts.template.params import TemplateParams, params_from_source
from actors.experts.template.render import analyse, render
from actors.experts.template.tuning import default_params, mutate, relevant_params

__all__ = [
    "Plan",
    "TemplateParams",
    "Unsupported",
    "analyse",
    "default_params",
    "mutate",
    "params_from_source",
    "relevant_params",
    "render",
]
