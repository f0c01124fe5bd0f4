"""The app's pages and router: one list of screens (``pages/``), the navigation built from it, and the guard each
page calls first.

``app.py`` calls ``route()`` on every run. A ``pages/`` folder beside ``app.py`` puts a freshly started Streamlit
server in its old folder mode until some session calls ``st.navigation``: the first visitor to a page's address then
runs that page's file without ``app.py``. Each page therefore begins with ``ensure_router()``: where the router has
not run in this session, it calls ``st.navigation`` with the same pages (Streamlit leaves folder mode) and reruns,
so the router and the page draw together, at the address the visitor opened.
"""

from __future__ import annotations

import streamlit as st

from comlrl_lab.ui import state

SETUP_PAGE = "pages/setup.py"
ROUNDS_PAGE = "pages/rounds.py"
PAIRS_PAGE = "pages/pairs.py"
REPLAY_PAGE = "pages/replay.py"
LEARNING_PAGE = "pages/learning.py"
COMPARE_PAGE = "pages/compare.py"
DATA_PAGE = "pages/data.py"

#: Set in a session once ``route()`` has run there.
ROUTER_RAN = "_router_ran"


def _pages() -> dict[str, list]:
    """The navigation's sections, with the hidden home page and the title-case address of every page."""
    setup = st.Page(SETUP_PAGE, title="Setup", icon=":material/tune:", url_path="setup")

    def home() -> None:
        # Streamlit serves its default page at "/" only, so /setup would be "Page not found" if Setup were the
        # default: the root is a hidden page that moves on to /setup, keeping the query (the open run, the draft).
        st.switch_page(setup, query_params=state.query_lists())

    sections = {
        "Experiment": [
            st.Page(home, title="Home", url_path="home", default=True, visibility="hidden"),
            setup,
            st.Page(ROUNDS_PAGE, title="Rounds", icon=":material/play_circle:", url_path="rounds"),
        ],
        "Results": [
            st.Page(PAIRS_PAGE, title="Pairs", icon=":material/compare:", url_path="pairs"),
            st.Page(REPLAY_PAGE, title="Replay", icon=":material/history:", url_path="replay"),
            st.Page(LEARNING_PAGE, title="Learning", icon=":material/monitoring:", url_path="learning"),
            st.Page(COMPARE_PAGE, title="Compare", icon=":material/stacked_line_chart:", url_path="compare"),
            st.Page(DATA_PAGE, title="Data", icon=":material/database:", url_path="data"),
        ],
    }
    # Streamlit matches an address to a page exactly: /Pairs, as the sidebar spells the page, would be "Page not
    # found". Hidden pages at the title-case addresses move on to the page itself.
    aliases = [state.alias_page(page) for pages in sections.values() for page in pages if page.url_path]  # not "/"
    return {**sections, "": aliases}


def route():
    """The page this run shows (``st.navigation`` over every screen); marks the session as routed."""
    page = st.navigation(_pages())
    st.session_state[ROUTER_RAN] = True
    return page


def ensure_router() -> None:
    """First call of every page: where this session's router has not run (a fresh server's folder mode ran the page
    file alone), hand the session to the router and rerun; otherwise nothing."""
    if not st.session_state.get(ROUTER_RAN):
        st.navigation(_pages())
        st.rerun()
