"""comlrl-lab workbench: ``streamlit run app.py``. The router: page config, navigation, the sidebar run card.

Each screen is a file in ``pages/``; they only lay out. Long-lived objects (the run manager and the stores) live
in ``comlrl_lab.ui.services``; the session remembers only the open run and view choices.
"""

import streamlit as st

from comlrl_lab.ui import components, state

st.set_page_config(page_title="comlrl-lab", page_icon=":material/hub:", layout="wide")

SETUP = st.Page("pages/setup.py", title="Setup", icon=":material/tune:", url_path="setup")


def _home() -> None:
    # Streamlit serves its default page at "/" only, so /setup would be "Page not found" if Setup were the
    # default: the root is a hidden page that moves on to /setup, keeping the query (the open run, the draft).
    st.switch_page(SETUP, query_params=st.query_params.to_dict())


PAGES = {
    "Experiment": [
        st.Page(_home, title="Home", url_path="home", default=True, visibility="hidden"),
        SETUP,
        st.Page("pages/rounds.py", title="Rounds", icon=":material/play_circle:", url_path="rounds"),
    ],
    "Results": [
        st.Page("pages/pairs.py", title="Pairs", icon=":material/compare:", url_path="pairs"),
        st.Page("pages/replay.py", title="Replay", icon=":material/history:", url_path="replay"),
        st.Page("pages/learning.py", title="Learning", icon=":material/monitoring:", url_path="learning"),
        st.Page("pages/compare.py", title="Compare", icon=":material/stacked_line_chart:", url_path="compare"),
        st.Page("pages/data.py", title="Data", icon=":material/database:", url_path="data"),
    ],
}

page = st.navigation(PAGES)
state.sync_run_with_url()

with st.sidebar:
    st.markdown("### comlrl-lab")
    st.caption("Preference-based multi-agent RL of LLMs, one round at a time.")
    components.sidebar_run_card()

page.run()
