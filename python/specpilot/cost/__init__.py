"""Cost model: per-component time against its ceiling, ranked by time lost per generated token."""
from specpilot.cost.ceilings import Ceilings, measure_ceilings
from specpilot.cost.gaps import CostReport, cost_report, format_table

__all__ = ["Ceilings", "CostReport", "cost_report", "format_table", "measure_ceilings"]
