"""Small-sample statistics for curves over seeds: Student's t quantile of a two-sided 95% interval.

The workbench's name for ``comlrl_lab.data.confidence``, where the numbers live since the trainers record
intervals too: the Compare page and the metric frames draw mean ± 95% CI curves over seeds with them, and the
learning benchmark and the notebooks import them from here. No pandas, no torch, no Streamlit.
"""

from __future__ import annotations

from comlrl_lab.data.confidence import ci95_half_width, t975

__all__ = ["ci95_half_width", "t975"]
