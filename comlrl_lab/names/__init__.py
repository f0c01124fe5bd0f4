"""The names every layer shares: the phases of a round, the metric names, and run ids.

The trainers report phases and metrics under these names, the store keeps and queries them, the engine and the
pages show them, and every one of those makes run ids. So they sit in the bottom layer, below ``data``: they
import nothing else of ``comlrl_lab``, nor torch, nor Streamlit, and whoever imports them pulls in nothing heavy
(``lint-imports`` keeps it so). Tasks and records are ``data``'s; this package only names things.
"""
