"""Session-state and widget keys of the workbench: every key a page or ``comlrl_lab.ui`` module uses is named here.

The session holds the open run id and view choices, nothing else. Everything durable (runs, pairs, metrics,
progress) lives in the engine and the store, so a closed tab loses nothing; the URL carries the open run
(``URL_RUN``) and the Setup draft (its widgets' keys, ``draft.write_draft_to_url``), so a reload or a shared link
opens the same view. Every key is ``<area>.<name>``: the page or panel it belongs to, a dot, then a lower-case
name (a part that varies, such as an algorithm or an agent index, is another dotted part). A keyed element's
container carries the CSS class ``st-key-<key>`` with dots written as hyphens, which the browser tests select on.
``tests/test_ui.py`` fails when a page or ui module spells a key in place instead of taking it from here. This
module does not read the store or start work.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

#: The run every page shows (engine runs and imported pair sets alike).
RUN_ID = "run.id"
#: The URL query parameter that carries the open run, so a reload, a bookmark or a shared link opens it again.
URL_RUN = "run.open"
URL_READ = "run.url_read"  # set once the session has taken its run from the URL

# Sidebar
SIDEBAR_RUN = "sidebar.run"

# Setup page. Config fields are keyed by ``config_field_key``; agents by ``agent_*_key``.
SETUP_NOTICE = "setup.notice"  # a notice carried over one rerun (e.g. "config loaded")
SETUP_GO_ROUNDS = "setup.go_rounds"  # set by a callback: switch to Rounds on the next rerun
SETUP_PRESET = "setup.preset"  # the spec the session's form starts from: forms.PRESET_QUICKSTART or PRESET_NONE
SETUP_PRESET_PICK = "setup.preset_pick"  # the ready-made spec the "Start from a preset" box offers to load
SETUP_LOAD_PRESET = "setup.load_preset"
SETUP_PAST = "setup.past"
SETUP_OPEN_PAST = "setup.open_past"
SETUP_COPY_PAST = "setup.copy_past"
SETUP_LOAD_FILE = "setup.load_file"
SETUP_APPLY_FILE = "setup.apply_file"
SETUP_NUM_AGENTS = "setup.num_agents"
SETUP_TASK_KIND = "setup.task_kind"
SETUP_TASK = "setup.task"
SETUP_USER_MODULE = "setup.user_module"
SETUP_USER_MODULE_UPLOAD = "setup.user_module_upload"
SETUP_USER_TRAIN = "setup.user_train"
SETUP_USER_EVAL = "setup.user_eval"
SETUP_CHECK_TASK = "setup.check_task"
SETUP_MAX_TRAIN_ITEMS = "setup.max_train_items"
SETUP_MAX_EVAL_ITEMS = "setup.max_eval_items"
SETUP_FAMILY = "setup.family"
SETUP_ITERATIVE = "setup.iterative"
SETUP_LAMBDA_PREVIEW = "setup.lambda_preview"
SETUP_APPLICABLE = "setup.applicable"  # algorithm -> the mode-dependent fields that applied on the last rerun
SETUP_FILLED = "setup.filled"  # widget key -> the value the form filled in when the field became required
SETUP_RUN_NAME = "setup.run_name"
SETUP_CREATE = "setup.create"
SETUP_SAVE = "setup.save"

# Setup page: the run list (filters, sort, archive and delete)
RUNS_LIST = "runs.list"  # the expander (open or not)
RUNS_BOX = "runs.box"
RUNS_ALGORITHM = "runs.algorithm"
RUNS_TASK = "runs.task"
RUNS_STATUS = "runs.status"
RUNS_TAGS = "runs.tags"
RUNS_TEXT = "runs.text"
RUNS_SORT = "runs.sort"
RUNS_TABLE = "runs.table"
RUNS_PICK = "runs.pick"
RUNS_CONFIRM = "runs.confirm"
RUNS_ARCHIVE = "runs.archive"
RUNS_DELETE = "runs.delete"

# Rounds page (the progress and error panels are drawn by ``components``)
ROUNDS_COUNT = "rounds.count"
ROUNDS_CONTROLS = "rounds.controls"
ROUNDS_RUN_ROUNDS = "rounds.run_rounds"
ROUNDS_RUN_ALL = "rounds.run_all"
ROUNDS_PAUSE = "rounds.pause"
ROUNDS_STOP = "rounds.stop"
ROUNDS_PROGRESS = "rounds.progress"
ROUNDS_ERROR = "rounds.error"
ROUNDS_RETRY = "rounds.retry"
ROUNDS_TIMELINE_TABLE = "rounds.timeline_table"
ROUNDS_TIMELINE_CHART = "rounds.timeline_chart"
ROUNDS_CHECKPOINT_COST = "rounds.checkpoint_cost"
ROUNDS_CHECKPOINT_TABLE = "rounds.checkpoint_table"

# Pairs page (the pair view is drawn by ``components``)
PAIRS_TAB = "pairs.tab"
PAIRS_ROUND = "pairs.round"
PAIRS_SIDE = "pairs.side"
PAIRS_ITEM = "pairs.item"
PAIRS_MIN_GAP = "pairs.min_gap"
PAIRS_MAX_GAP = "pairs.max_gap"
PAIRS_TEXT = "pairs.text"
PAIRS_PAGE = "pairs.page"
PAIRS_TABLE = "pairs.table"
PAIRS_OPEN = "pairs.open"
PAIRS_CANDIDATES_CHART = "pairs.candidates_chart"
# The Pairs page's Label tab (``labelling``): its buttons are keyed by their keyboard key, label.key.<key>.
LABEL_KEYS = "label.key"
LABEL_LABELLER = "label.labeller"
LABEL_SKIPPED = "label.skipped"  # (round, pair_index) keys this session skipped
LABEL_HISTORY = "label.history"  # (round, pair_index, labeller) of this session's verdicts, for undo
LABEL_LAST = "label.last"  # what the last verdict revealed, shown above the next comparison
LABEL_GUIDELINE = "label.guideline"
LABEL_COMPARISON = "label.comparison"
LABEL_FOCUS = "label.focus"  # set when the labeller name changes: the next comparison takes the focus
LABEL_UNSKIP = "label.unskip"
LABEL_GO_ON = "label.go_on"
LABEL_AGREEMENT_TABLE = "label.agreement_table"
SQL_QUERY = "sql.query"
SQL_SUBMITTED = "sql.submitted"
SQL_LIMIT = "sql.limit"
SQL_RUN = "sql.run"
SQL_RESULT = "sql.result"
SQL_DOWNLOAD = "sql.download"

# Replay page
REPLAY_ROUND = "replay.round"
REPLAY_LAMBDA = "replay.lambda"
REPLAY_K = "replay.k"
REPLAY_DRAWS_CHART = "replay.draws_chart"
REPLAY_DRAWS_TABLE = "replay.draws_table"
REPLAY_MODE_WEIGHTS = "replay.mode_weights"
REPLAY_LAMBDA_CHART = "replay.lambda_chart"
REPLAY_LAMBDA_TEXT = "replay.lambda_text"

# Learning page
LEARNING_ROUND = "learning.round"
LEARNING_PER_STEP = "learning.per_step"
LEARNING_STEP_CHART = "learning.step_chart"
LEARNING_REWARD_HIST = "learning.reward_hist"
LEARNING_REWARD_BOXES = "learning.reward_boxes"
LEARNING_LOGGED_DISTRIBUTION = "learning.logged_distribution"

# Compare page
COMPARE_ALGORITHMS = "compare.algorithms"
COMPARE_TASKS = "compare.tasks"
COMPARE_TAGS = "compare.tags"
COMPARE_RUNS = "compare.runs"
COMPARE_RUNS_TABLE = "compare.runs_table"
COMPARE_FILTERS_SEEN = "compare.filters_seen"  # the filters (and runs they matched) the selection was filled from
COMPARE_BY_SEED = "compare.by_seed"
COMPARE_SMOOTHING = "compare.smoothing"
COMPARE_CURVES_CHART = "compare.curves_chart"
COMPARE_DIFF_TABLE = "compare.diff_table"
COMPARE_PAIRS_TABLE = "compare.pairs_table"
COMPARE_GAPS_CHART = "compare.gaps_chart"
COMPARE_SIDES_CHART = "compare.sides_chart"
COMPARE_GROUPS_TABLE = "compare.groups_table"
COMPARE_OUTCOMES_TABLE = "compare.outcomes_table"
COMPARE_DIFF_A = "compare.diff_a"  # the two groups whose difference the page states
COMPARE_DIFF_B = "compare.diff_b"

# Sweeps ("Run a grid" on the Compare page)
SWEEP_ID = "sweep.id"  # the sweep this session follows: started here, or opened
SWEEP_OPEN = "sweep.open"
SWEEP_BASE = "sweep.base"
SWEEP_FORM = "sweep.form"
SWEEP_START = "sweep.start"
SWEEP_SEEDS = "sweep.seeds"
SWEEP_PARALLEL = "sweep.parallel"
SWEEP_CONFIRM = "sweep.confirm"
SWEEP_STOP = "sweep.stop"
SWEEP_LAUNCHER = "sweep.launcher"  # offered only where Slurm can be reached
SWEEP_PARTITION = "sweep.partition"
SWEEP_TIME = "sweep.time"
SWEEP_GPUS = "sweep.gpus"

# Data page
DATA_TAB = "data.tab"
EXPORT_FORMAT = "export.format"
EXPORT_ROUND = "export.round"
EXPORT_SIDE = "export.side"
EXPORT_ITEM = "export.item"
EXPORT_MIN_GAP = "export.min_gap"
EXPORT_MAX_GAP = "export.max_gap"
EXPORT_TEXT = "export.text"
EXPORT_BUILD = "export.build"
EXPORT_RESULT = "export.result"  # the last export built: path, count, format, run id
EXPORT_RESULT_BOX = "export.result_box"
EXPORT_DOWNLOAD = "export.download"
IMPORT_DIR_BOX = "import.dir_box"
IMPORT_DIR = "import.dir"
IMPORT_DIR_BUTTON = "import.dir_button"
IMPORT_FILES_BOX = "import.files_box"
IMPORT_FILES = "import.files"
IMPORT_FILES_BUTTON = "import.files_button"
IMPORT_RESULT = "import.result"  # the last import: run id, files, skipped files, pairs, rounds
IMPORT_RESULT_BOX = "import.result_box"
IMPORT_OPEN = "import.open"


@dataclass(frozen=True)
class PairFilterKeys:
    """The keys of one row of pair filters (``components.pair_filters``): its container and its six widgets."""

    box: str
    round: str
    side: str
    item: str
    min_gap: str
    max_gap: str
    text: str


PAIRS_FILTERS = PairFilterKeys(
    "pairs.filters", PAIRS_ROUND, PAIRS_SIDE, PAIRS_ITEM, PAIRS_MIN_GAP, PAIRS_MAX_GAP, PAIRS_TEXT
)
EXPORT_FILTERS = PairFilterKeys(
    "export.filters", EXPORT_ROUND, EXPORT_SIDE, EXPORT_ITEM, EXPORT_MIN_GAP, EXPORT_MAX_GAP, EXPORT_TEXT
)


# -- keys with a part that varies ---------------------------------------------------------------------------


def config_field_key(algorithm: str, name: str) -> str:
    """The Setup widget of config field ``name`` of ``algorithm`` (each algorithm keeps its own values)."""
    return f"cfg.{algorithm}.{name}"


def setup_group_key(title: str) -> str:
    """The Setup expander ``title`` (a field group, "More comparator fields"): its open state, kept on the server."""
    return "setup.group." + "".join(c if c.isalnum() else "_" for c in title.lower())


def agent_source_key(i: int) -> str:
    return f"setup.agent.{i}.source"


def agent_model_key(i: int) -> str:
    return f"setup.agent.{i}.model"


def agent_footprint_key(i: int) -> str:
    return f"setup.agent.{i}.footprint"


def upload_key(key: str) -> str:
    """The file uploader that sits beside the text input keyed ``key``."""
    return f"{key}.upload"


def label_key(key: str) -> str:
    """The Label tab's button that keyboard key ``key`` (1 2 3 4 s u) presses."""
    return f"{LABEL_KEYS}.{key}"


def label_side_key(name: str) -> str:
    """The box of shown side ``name`` (A or B) of the comparison being labelled."""
    return f"label.side.{name}"


def phase_button_key(phase: str) -> str:
    return f"rounds.phase.{phase}"


def learning_chart_key(name: str) -> str:
    return f"learning.{name}_chart"


def sweep_field_key(i: int) -> str:
    return f"sweep.field.{i}"


def sweep_values_key(i: int) -> str:
    return f"sweep.values.{i}"


def pair_agent_key(i: int, part: str | None = None) -> str:
    """Agent ``i``'s box in the pair view, or its ``part`` ("winner" or "loser")."""
    return f"pairs.agent.{i}" if part is None else f"pairs.agent.{i}.{part}"


def pair_breakdown_key(part: str) -> str:
    """The box of the winner's or the loser's reward breakdown (``part`` "winner" or "loser") in the pair view."""
    return f"pairs.breakdown.{part}"


# -- the open run ---------------------------------------------------------------------------------------------


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


def sync_run_with_url() -> None:
    """Open the run the URL names when a session starts (a reload, a bookmark), then keep the URL on the open run.

    Call once per rerun, before the page runs. Streamlit drops query parameters on a page switch, so the URL is
    written again on every rerun.
    """
    if not st.session_state.get(URL_READ):
        st.session_state[URL_READ] = True
        wanted = st.query_params.get(URL_RUN)
        if wanted and current_run_id() is None:
            set_current_run(wanted)
    run_id = current_run_id()
    if run_id is None:
        st.query_params.pop(URL_RUN, None)
    elif st.query_params.get(URL_RUN) != run_id:
        st.query_params[URL_RUN] = run_id


def query_lists() -> dict[str, list[str]]:
    """The URL's query, every value of a repeated name kept (``to_dict`` keeps the last one only)."""
    return {name: st.query_params.get_all(name) for name in st.query_params}


def alias_page(page):
    """A hidden page at ``page``'s address in title case (``/Pairs``) that moves on to ``page``, query kept."""

    def move_on() -> None:
        st.switch_page(page, query_params=query_lists())

    return st.Page(move_on, title=page.title, url_path=page.url_path.title(), visibility="hidden")


def switch_page(page) -> None:
    """``st.switch_page`` that keeps the open run in the URL.

    Streamlit's own clears the query; the Setup draft is left behind (the Setup page writes it again when it is
    drawn, from the session).
    """
    run_id = current_run_id()
    st.switch_page(page, query_params={URL_RUN: run_id} if run_id else {})


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
