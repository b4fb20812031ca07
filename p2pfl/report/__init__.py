"""`p2pfl report DIR`: pictures from a run folder (results.json + artefacts) or a compare folder.

`style` (matplotlib without a display, the shared look) comes first; `run_figures` draws one run,
`compare_figures` a compare folder and several of them, `folders` picks by what DIR holds,
`tables` writes the Markdown tables and `dashboard` serves the live view.
"""

# style first: it sets matplotlib's Agg backend before any figure module loads pyplot.
from p2pfl.report.style import MAX_NODE_SERIES, plot_nodes  # isort: skip
from p2pfl.report.compare_figures import report_compare, report_held_out, report_poisoning
from p2pfl.report.folders import make_report, merge_node_results
from p2pfl.report.run_figures import report_run, representative_nodes

__all__ = ["MAX_NODE_SERIES", "make_report", "merge_node_results", "plot_nodes", "report_compare", "report_held_out",
           "report_poisoning", "report_run", "representative_nodes"]
