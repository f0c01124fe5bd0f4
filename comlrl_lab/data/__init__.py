"""Tasks and records: what the trainers read (task items, prompt formatters, reward functions) and what they write.

``tasks`` (built in) and ``user_tasks`` make a ``Task``; ``datasets`` and ``formatters`` read items and prompts;
``rewards`` calls reward functions with CoMLRL's convention; ``records`` holds the candidate and pair records
with the seed's JSON, and ``reward_distribution`` CoMLRL's per-round reward histograms. Nothing here imports torch
or the store. The names every layer shares (phases, metric names, run ids) are in ``comlrl_lab.names``; the
credentials of comparator settings are with the configs (``trainers.preference.credentials``). ``confidence`` holds
the 95% interval statistics that evaluations record and the workbench's curves draw, and ``code_eval`` what an
evaluation of a code task reports (pass@1 and the mean level reward).
"""
