"""``kfoundry bench``: ``kfoundry run`` over the problems of a KernelBench checkout, one by one.

- ``problems``: the checkout's layout, problem specs (``1,2,5-9``, ``dev``, ``all``) and the
  development subset (the one place it is defined);
- ``monitor``: peak host and GPU memory of a run's process tree, sampled from outside;
- ``runner``: one problem as its own ``kfoundry run`` subprocess, classified from its exit status
  and ``report.json``;
- ``results``: the typed per-problem results, the totals (share correct, ``fast_p``, geometric
  means) and the Markdown table;
- ``bench``: the command itself (resume, progress, SIGINT).
"""
