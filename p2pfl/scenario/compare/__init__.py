"""`p2pfl compare`, in three rooms: the rows `--algorithms` names (`rows.py`), running or reusing
their runs (`runs.py`), and the statistics and table made from them (`table.py`)."""

from p2pfl.scenario.compare.rows import Row, parse_algorithms, row_raw
from p2pfl.scenario.compare.runs import PLAN_FILE, run_compare
from p2pfl.scenario.compare.table import format_table, paired_table, summarize_run

__all__ = ["PLAN_FILE", "Row", "format_table", "paired_table", "parse_algorithms", "row_raw", "run_compare",
           "summarize_run"]
