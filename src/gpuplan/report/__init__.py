"""Reports of a plan: a self-contained HTML page with inline SVG charts.

Reports only format a :class:`~gpuplan.planner.Plan`; they never recompute it.
"""

from gpuplan.report.html import render_html

__all__ = ["render_html"]
