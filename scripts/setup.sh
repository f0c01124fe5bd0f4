#!/usr/bin/env bash
# One command sets up everything: the CPU torch wheel where no torch is present, then the package and its
# development tools (through uv, pip where uv cannot). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

# Browser tests drive Debian's chromium (its headless shell where there is one: the same engine for less CPU); install
# them when we can (root on Debian) and one is missing. They install in the background while pip works, and are
# waited for at the end.
browser_pid=""
browser_log="$(mktemp)"
if [ "${COMLRL_LAB_SKIP_BROWSER:-0}" != "1" ] \
        && ! { command -v chromium && command -v chromium-headless-shell; } >/dev/null 2>&1 \
        && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    # The headless shell on its own line: a release without it still gets chromium, which the tests then drive.
    (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-liberation \
        && { apt-get install -y -qq --no-install-recommends chromium-headless-shell \
             || echo "setup: no chromium-headless-shell here; browser tests drive chromium"; }) >"$browser_log" 2>&1 &
    browser_pid=$!
fi

# uv resolves, downloads and installs several times faster than pip; where uv cannot be had or cannot install into
# this Python, pip does it as before.
have_uv=false
"$PYTHON" -m pip install -q uv && have_uv=true

if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    # A bare "torch" requirement would pull a multi-GB CUDA build; the pinned CPU wheel is enough here. Where pip is
    # configured with folders of wheels (find-links) that hold it, uv installs that "+cpu" wheel from them: uv reads no
    # pip config, and PyPI has no "+cpu" build, so nothing else can match. Compiled to bytecode, as pip does: where
    # Python may not write .pyc files (PYTHONDONTWRITEBYTECODE), every process would compile torch again (3 s).
    torch_version="${COMLRL_LAB_TORCH_VERSION:-2.13.0}"
    links="${PIP_FIND_LINKS:-$("$PYTHON" -m pip config get global.find-links 2>/dev/null || true)}"
    link_args=()
    for link in $links; do link_args+=(--find-links "$link"); done
    if ! { $have_uv && [ "${#link_args[@]}" -gt 0 ] \
            && "$PYTHON" -m uv pip install --python "$PYTHON" --compile-bytecode "${link_args[@]}" \
                "torch==${torch_version}+cpu"; }; then
        "$PYTHON" -m pip install "torch==${torch_version}"
    fi
fi
if ! { $have_uv && "$PYTHON" -m uv pip install --python "$PYTHON" --compile-bytecode -e ".[dev]"; }; then
    echo "setup: installing with pip"
    "$PYTHON" -m pip install -e ".[dev]"
fi

# The package's own modules compiled once, as uv compiles its dependencies: where Python may not write .pyc files
# (PYTHONDONTWRITEBYTECODE), every process that imports them would compile them again.
"$PYTHON" -m compileall -q comlrl_lab || echo "setup: comlrl_lab could not be compiled to bytecode"

# pyenv finds a Python's commands through shims that only its own pip hook refreshes: after uv's install, `streamlit`,
# `ruff` and the rest would be "command not found" until the shims are rebuilt.
if command -v pyenv >/dev/null 2>&1; then
    pyenv rehash || echo "setup: pyenv rehash failed; run it before using the installed commands"
fi

if [ -n "$browser_pid" ]; then
    if wait "$browser_pid"; then
        grep "^setup:" "$browser_log" || true
        echo "setup: chromium installed"
    else
        cat "$browser_log"
        echo "setup: chromium could not be installed; browser tests will be skipped"
    fi
fi
rm -f "$browser_log"
echo "setup: done. Next: streamlit run app.py"
