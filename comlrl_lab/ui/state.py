"""Session-state keys of the workbench: the open run id and view choices, nothing else.

Everything durable (runs, pairs, metrics, progress) lives in the engine and the store, so a closed tab loses
nothing; a new tab only has to pick the run again. Widget keys of view choices are named here so pages and tests
agree on them. This module does not read the store or start work.
"""

from __future__ import annotations

import streamlit as st

#: The run every page shows (engine runs and imported pair sets alike).
RUN_ID = "run_id"

# Rounds page
ROUNDS_COUNT = "rounds.count"

# Pairs page
PAIRS_ROUND = "pairs.round"
PAIRS_SIDE = "pairs.side"
PAIRS_ITEM = "pairs.item"
PAIRS_MIN_GAP = "pairs.min_gap"
PAIRS_MAX_GAP = "pairs.max_gap"
PAIRS_TEXT = "pairs.text"
PAIRS_PAGE = "pairs.page"
PAIRS_TABLE = "pairs.table"
PAIRS_OPEN = "pairs.open"
SQL_QUERY = "sql.query"
SQL_SUBMITTED = "sql.submitted"

# Replay page
REPLAY_ROUND = "replay.round"
REPLAY_LAMBDA = "replay.lambda"
REPLAY_K = "replay.k"

# Learning page
LEARNING_ROUND = "learning.round"
LEARNING_PER_STEP = "learning.per_step"

# Data page
EXPORT_FORMAT = "export.format"
EXPORT_RESULT = "export.result"
IMPORT_RESULT = "import.result"

# Setup page: notices carried over one rerun (e.g. "config loaded").
SETUP_NOTICE = "setup.notice"


def current_run_id() -> str | None:
    value = st.session_state.get(RUN_ID)
    return str(value) if value else None


def set_current_run(run_id: str | None) -> None:
    """Make ``run_id`` the run every page shows, and forget view choices that belonged to the previous one."""
    if st.session_state.get(RUN_ID) == run_id:
        return
    st.session_state[RUN_ID] = run_id
    for key in (PAIRS_OPEN, PAIRS_PAGE, PAIRS_ROUND, REPLAY_ROUND, LEARNING_ROUND, EXPORT_RESULT):
        st.session_state.pop(key, None)


def follow_latest(key: str, options: list) -> None:
    """Keep the choice ``key`` on the newest option unless the user picked an older one (call before the widget).

    A page that defaults to "the latest round" keeps showing the latest as new rounds finish, while a user who
    chose round 2 stays on round 2.
    """
    if not options:
        return
    seen_key = f"{key}.latest"
    current = st.session_state.get(key)
    if current not in options or current == st.session_state.get(seen_key):
        st.session_state[key] = options[-1]
    st.session_state[seen_key] = options[-1]
