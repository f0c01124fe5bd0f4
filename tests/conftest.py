"""Suite-wide settings (one torch thread) and the fixtures several test modules share.

The models in the suite are tiny; with torch's default thread count the two cores of these machines spend
more time synchronising threads than computing, and a busy neighbour makes that many times worse (a notebook
went from 14 s to 181 s). Subprocesses (torchrun, the CLI, notebook kernels) inherit the environment variable.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402  (after the environment is set, so the first import sees it)
from model_fixtures import build_tiny_model_dir  # noqa: E402
from trainer_fixtures import build_trainer  # noqa: E402

from comlrl_lab.store import RunStore  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    """A random tiny Llama and its tokenizer saved in a folder; built once, read-only for the tests."""
    return str(build_tiny_model_dir(tmp_path_factory.mktemp("tiny")))


@pytest.fixture
def make_trainer(model_dir):
    """``make_trainer(kind, tmp_path, *settings, **overrides)``: a trainer of small settings on the random tiny
    model; the settings and what the keywords override are in ``trainer_fixtures``."""

    def make(kind: str, tmp_path, *settings: dict, **overrides):
        return build_trainer(kind, model_dir, tmp_path, *settings, **overrides)

    return make


@pytest.fixture
def sample_two_prompts(model_dir):
    """``sample_two_prompts(**change)``: the tiny model's 4 candidates for each of two prompts of different
    lengths, seeded per row, as completion ids; the keywords change the ``SamplingSettings``. The model is
    ``sample_two_prompts.model``, so a test can change its dtype between calls."""
    import dataclasses

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl_lab.models.generation import SamplingSettings, sample_candidates

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings = SamplingSettings(max_new_tokens=6, temperature=1.5, top_p=1.0, top_k=None, batch_size=8)

    def sample(**change) -> list[list[list[int]]]:
        rows = sample_candidates(
            model,
            tokenizer,
            ["the red cat sat on the mat", "a dog"],
            4,
            dataclasses.replace(settings, **change),
            None,
            row_seeds=[3, 4],
        )
        return [[candidate.completion_ids for candidate in row] for row in rows]

    sample.model = model
    return sample


@pytest.fixture
def store(tmp_path):
    """An empty read-write store in the test's own file (DuckDB locks a file to one process)."""
    # In a folder of its own: the tests export next to it, and an export never writes into a run folder.
    s = RunStore(tmp_path / "store" / "run.duckdb")
    yield s
    s.close()


def pytest_runtest_makereport(item, call):
    # The browser steps share one page, each starting where the last one left it: after a failure the rest
    # skip (tests/test_browser.py reads failed_step), so the report names the broken step, not its followers.
    failed = call.when == "call" and call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception)
    if failed and getattr(item.module, "failed_step", "") is None:
        item.module.failed_step = item.name


#: Marks of the tests that run for seconds to minutes: training runs, a browser, a real model.
LONG_RUNNING_MARKS = ("slow", "browser", "real_model")


def pytest_configure(config):
    # pytest-xdist's --dist loadfile hands out files with the most tests first; ours take their time from a few
    # long tests, so that order left a one-test browser file for last while the other worker idled. Files go out in
    # collection order instead, which pytest_collection_modifyitems sets.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """Files with the most long-running tests first (then the most tests), each file's own order kept: with two
    workers the long files start early and the short ones fill the end, instead of one worker finishing a long file
    alone."""
    weight: dict[str, tuple[int, int]] = {}
    for item in items:
        long_running = any(item.get_closest_marker(name) for name in LONG_RUNNING_MARKS)
        marked, total = weight.get(item.location[0], (0, 0))
        weight[item.location[0]] = (marked + long_running, total + 1)
    items.sort(key=lambda item: weight[item.location[0]], reverse=True)
