"""comlrl-lab workbench: ``streamlit run app.py``. The router: page config, navigation, the sidebar run card.

Each screen is a file in ``pages/``; they only lay out, and each begins with ``navigation.ensure_router()``.
Long-lived objects (the run manager and the stores) live in ``comlrl_lab.ui.services``; the session remembers only
the open run and view choices.
"""

import streamlit as st

from comlrl_lab.ui import components, navigation, state

st.set_page_config(page_title="comlrl-lab", page_icon=":material/hub:", layout="wide")

page = navigation.route()
state.sync_run_with_url()

with st.sidebar:
    st.markdown("### comlrl-lab")
    st.caption("Preference-based multi-agent RL of LLMs, one round at a time.")
    components.sidebar_run_card(poll=page.url_path != "rounds")

page.run()
