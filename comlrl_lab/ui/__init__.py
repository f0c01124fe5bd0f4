"""The Streamlit workbench's support code: the only package that imports streamlit.

``services`` holds the server-wide workspace (``st.cache_resource``), ``state`` the session keys, ``forms`` the
config widgets generated from the dataclasses, ``charts`` the plotly figures, ``diff`` the word-level diff,
``frames`` the pandas shaping and ``components`` the pieces pages share. Pages in ``pages/`` only lay out (``navigation`` lists them).
"""
