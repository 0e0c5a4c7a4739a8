"""The run's report and its plots, in one place: what ``report.json`` and the PNGs of a run hold.

- :mod:`.model`: the report's types (what ``report.json`` holds);
- :mod:`.build`: the report, rebuilt from the run's stream and the islands' saved brains;
- :mod:`.experts`: what each expert earned, per role and diagnosis family;
- :mod:`.plots`: fitness over time, credit, the MAP-Elites heat maps.
"""

from actors.report.build import build_report, isolation_warning, write_report
from actors.report.model import BestKernel, IslandReport, RunReport

__all__ = ["BestKernel", "IslandReport", "RunReport", "build_report", "isolation_warning", "write_report"]
