"""comlrl-lab workbench: ``streamlit run app.py``. The router: page config, navigation, the sidebar run card.

Each screen is a file in ``app_pages/``; they only lay out. (Not ``pages/``: with a folder of that name, Streamlit
runs a page's file without this router when a freshly started server's first visitor opens the page's address.)
Long-lived objects (the run manager and the stores) live in ``comlrl_lab.ui.services``; the session remembers only
the open run and view choices.
"""

import streamlit as st

from comlrl_lab.ui import components, state

st.set_page_config(page_title="comlrl-lab", page_icon=":material/hub:", layout="wide")

SETUP = st.Page("app_pages/setup.py", title="Setup", icon=":material/tune:", url_path="setup")


def _home() -> None:
    # Streamlit serves its default page at "/" only, so /setup would be "Page not found" if Setup were the
    # default: the root is a hidden page that moves on to /setup, keeping the query (the open run, the draft).
    st.switch_page(SETUP, query_params=state.query_lists())


PAGES = {
    "Experiment": [
        st.Page(_home, title="Home", url_path="home", default=True, visibility="hidden"),
        SETUP,
        st.Page("app_pages/rounds.py", title="Rounds", icon=":material/play_circle:", url_path="rounds"),
    ],
    "Results": [
        st.Page("app_pages/pairs.py", title="Pairs", icon=":material/compare:", url_path="pairs"),
        st.Page("app_pages/replay.py", title="Replay", icon=":material/history:", url_path="replay"),
        st.Page("app_pages/learning.py", title="Learning", icon=":material/monitoring:", url_path="learning"),
        st.Page("app_pages/compare.py", title="Compare", icon=":material/stacked_line_chart:", url_path="compare"),
        st.Page("app_pages/data.py", title="Data", icon=":material/database:", url_path="data"),
    ],
}
# Streamlit matches an address to a page exactly: /Pairs, as the sidebar spells the page, would be "Page not found".
# Hidden pages at the title-case addresses move on to the page itself.
ALIASES = [state.alias_page(page) for pages in PAGES.values() for page in pages if page.url_path]  # not "/"

page = st.navigation({**PAGES, "": ALIASES})
state.sync_run_with_url()

with st.sidebar:
    st.markdown("### comlrl-lab")
    st.caption("Preference-based multi-agent RL of LLMs, one round at a time.")
    components.sidebar_run_card(poll=page.url_path != "rounds")

page.run()
