"""User task data: item loading (lists, datasets.Dataset, JSONL/JSON/CSV), formatters, import paths, user tasks."""

from __future__ import annotations

import json
import pickle
import sys
import textwrap
from pathlib import Path

import pytest

from comlrl_lab.data.datasets import load_items, require_prompt_key
from comlrl_lab.data.formatters import MissingPromptError, format_prompts, resolve_formatters
from comlrl_lab.data.rewards import apply_reward_processor, call_reward_function
from comlrl_lab.data.user_tasks import UserTaskError, UserTaskSpec, load_module, load_object, load_user_task

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_MODULE = REPO / "examples" / "custom_task" / "my_task.py"
EXAMPLE_DATA = REPO / "examples" / "custom_task" / "data.jsonl"


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------
# load_items: Python objects


def test_list_and_tuple_of_dicts_are_copied():
    rows = [{"prompt": "a"}, {"prompt": "b", "x": 1}]
    items = load_items(rows)
    assert items == rows and items[0] is not rows[0]
    assert load_items(tuple(rows)) == rows


def test_hf_dataset_is_read_by_duck_typing():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"prompt": "a", "n": 1}, {"prompt": "b", "n": 2}])
    assert load_items(ds) == [{"prompt": "a", "n": 1}, {"prompt": "b", "n": 2}]


def test_indexable_sequence_without_to_list():
    class Rows:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"prompt": f"p{i}"}

    assert load_items(Rows()) == [{"prompt": "p0"}, {"prompt": "p1"}]


def test_dataframe_and_generator():
    pd = pytest.importorskip("pandas")
    assert load_items(pd.DataFrame({"prompt": ["a", "b"]})) == [{"prompt": "a"}, {"prompt": "b"}]
    assert load_items({"prompt": str(i)} for i in range(2)) == [{"prompt": "0"}, {"prompt": "1"}]


def test_bad_python_sources():
    with pytest.raises(ValueError, match="empty"):
        load_items([])
    with pytest.raises(ValueError, match="item 1: expected a dict"):
        load_items([{"prompt": "a"}, "b"])
    with pytest.raises(ValueError, match="pick a split"):
        load_items({"train": [{"prompt": "a"}]})
    with pytest.raises(ValueError, match="Cannot read task items from int"):
        load_items(3)


# ---------------------------------------------------------------------------------------------------
# load_items: files


def test_jsonl_skips_blank_lines(tmp_path):
    path = write(tmp_path / "data.jsonl", '{"prompt": "a"}\n\n   \n{"prompt": "b", "n": 2}\n')
    assert load_items(path) == [{"prompt": "a"}, {"prompt": "b", "n": 2}]
    assert load_items(str(path)) == load_items(path)


def test_jsonl_bad_line_names_file_and_line(tmp_path):
    path = write(tmp_path / "data.jsonl", '{"prompt": "a"}\n\n{"prompt": oops}\n')
    with pytest.raises(ValueError, match=r"data\.jsonl line 3: not valid JSON \(Expecting value at column 12\)"):
        load_items(path)


def test_jsonl_non_object_row(tmp_path):
    path = write(tmp_path / "data.jsonl", '{"prompt": "a"}\n["prompt", "b"]\n')
    with pytest.raises(ValueError, match=r"data\.jsonl line 2: expected a JSON object, got an array"):
        load_items(path)


def test_jsonl_empty_file(tmp_path):
    path = write(tmp_path / "data.jsonl", "\n\n")
    with pytest.raises(ValueError, match=r"data\.jsonl: the file holds no task items"):
        load_items(path)


def test_json_list_and_wrapped_forms(tmp_path):
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    assert load_items(write(tmp_path / "a.json", json.dumps(rows))) == rows
    assert load_items(write(tmp_path / "b.json", json.dumps({"data": rows}))) == rows
    assert load_items(write(tmp_path / "c.json", json.dumps({"items": rows}))) == rows


def test_json_errors(tmp_path):
    with pytest.raises(ValueError, match=r"bad\.json line 2: not valid JSON"):
        load_items(write(tmp_path / "bad.json", '[\n{"prompt": }\n]'))
    with pytest.raises(ValueError, match=r"obj\.json: expected a list of objects or"):
        load_items(write(tmp_path / "obj.json", '{"rows": []}'))
    with pytest.raises(ValueError, match=r"mixed\.json item 1: expected a JSON object, got a number"):
        load_items(write(tmp_path / "mixed.json", '[{"prompt": "a"}, 3]'))
    with pytest.raises(ValueError, match=r"none\.json: the file holds no task items"):
        load_items(write(tmp_path / "none.json", "[]"))


def test_csv_header_rows_and_quoting(tmp_path):
    path = write(
        tmp_path / "data.csv",
        """
        prompt,answer
        "Say ""hi"", then stop",4

        "line one
        line two",5
        """,
    )
    assert load_items(path) == [
        {"prompt": 'Say "hi", then stop', "answer": "4"},
        {"prompt": "line one\nline two", "answer": "5"},
    ]


def test_csv_errors(tmp_path):
    with pytest.raises(ValueError, match=r"ragged\.csv line 3: 3 fields, but the header has 2 columns"):
        load_items(write(tmp_path / "ragged.csv", "prompt,answer\na,1\nb,2,3\n"))
    with pytest.raises(ValueError, match=r"empty\.csv: the file is empty"):
        load_items(write(tmp_path / "empty.csv", ""))
    with pytest.raises(ValueError, match=r"header\.csv: the file holds no task items"):
        load_items(write(tmp_path / "header.csv", "prompt,answer\n"))
    with pytest.raises(ValueError, match=r"dup\.csv line 1: duplicate column names \['a'\]"):
        load_items(write(tmp_path / "dup.csv", "a,a\n1,2\n"))


def test_csv_with_utf8_bom(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffprompt\nhé\n".encode())
    assert load_items(path) == [{"prompt": "hé"}]


def test_missing_file_and_unknown_suffix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Data file not found: .*nope\.jsonl"):
        load_items(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match=r"unsupported file type '\.txt'"):
        load_items(write(tmp_path / "data.txt", "x"))
    with pytest.raises(ValueError, match="is a directory"):
        load_items(tmp_path)


def test_require_prompt_key():
    require_prompt_key([{"prompt": "a"}])
    with pytest.raises(ValueError, match=r"data\.jsonl: item 1 has no 'prompt' key \(keys: 'question'\)"):
        require_prompt_key([{"prompt": "a"}, {"question": "b"}], source="data.jsonl")


# ---------------------------------------------------------------------------------------------------
# Formatters


def test_no_formatters_reads_prompt_key():
    fmts = resolve_formatters(None, 2)
    assert [f({"prompt": "hi"}) for f in fmts] == ["hi", "hi"]
    with pytest.raises(MissingPromptError, match=r"no 'prompt' key \(keys: 'question'\)") as info:
        fmts[0]({"question": "x"})
    assert isinstance(info.value, ValueError) and isinstance(info.value, KeyError)
    assert str(info.value).startswith("Task item has no 'prompt' key")


def test_one_shared_formatter_and_one_per_agent():
    shared = resolve_formatters(lambda item: item["q"].upper(), 3)
    assert [f({"q": "x"}) for f in shared] == ["X", "X", "X"]
    per_agent = resolve_formatters([lambda item: "A:" + item["q"], lambda item: "B:" + item["q"]], 2)
    assert format_prompts(per_agent, [{"q": "1"}, {"q": "2"}]) == [["A:1", "A:2"], ["B:1", "B:2"]]


def test_external_prompts_keyword_is_passed_as_none():
    seen = []

    def with_external(item, external_prompts=None):
        seen.append(external_prompts)
        return item["q"]

    def with_kwargs(item, **kwargs):
        seen.append(kwargs)
        return item["q"]

    fmts = resolve_formatters([with_external, with_kwargs], 2)
    assert [f({"q": "x"}) for f in fmts] == ["x", "x"]
    assert seen == [None, {"external_prompts": None}]


def test_formatter_errors():
    with pytest.raises(ValueError, match=r"^Number of formatters must match num_agents when providing a sequence\.$"):
        resolve_formatters([str], 2)
    with pytest.raises(ValueError, match=r"formatters\[1\] must be callable"):
        resolve_formatters([str, "nope"], 2)
    with pytest.raises(ValueError, match="num_agents must be a positive integer"):
        resolve_formatters(None, 0)
    with pytest.raises(ValueError, match="formatters must be None, a callable, or a sequence"):
        resolve_formatters(42, 2)
    bad = resolve_formatters(lambda item: 7, 2)
    with pytest.raises(TypeError, match="for agent 2 returned int"):
        bad[1]({})


# ---------------------------------------------------------------------------------------------------
# load_object


def test_load_object_dotted_and_file_paths(tmp_path):
    assert load_object("json:dumps") is json.dumps
    assert load_object("os.path:join.__name__") == "join"
    path = write(tmp_path / "helper.py", "VALUE = 41\ndef f():\n    return VALUE + 1\n")
    f = load_object(f"{path}:f")
    assert f() == 42
    assert load_object(f"{path}:f") is f  # unchanged file: loaded once


def test_load_object_reloads_a_changed_file(tmp_path):
    path = write(tmp_path / "mod.py", "X = 1\n")
    assert load_object(f"{path}:X") == 1
    write(path, "X = 22\n")
    assert load_object(f"{path}:X") == 22


def test_file_module_can_import_its_neighbours(tmp_path):
    write(tmp_path / "neighbour_for_comlrl_test.py", "WORD = 'hello'\n")
    path = write(tmp_path / "main_mod.py", "from neighbour_for_comlrl_test import WORD\n")
    assert load_object(f"{path}:WORD") == "hello"
    assert str(tmp_path) not in sys.path


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("json", r"expected 'package\.module:attribute' or 'path/to/file\.py:attribute'"),
        (":dumps", "expected 'package.module:attribute'"),
        ("json:", "expected 'package.module:attribute'"),
        ("json:not-valid", "expected 'package.module:attribute'"),
        ("no_such_module_xyz:f", r"cannot find module 'no_such_module_xyz'"),
        ("json:no_such_attr", r"'json:no_such_attr': 'json' has no attribute 'no_such_attr'; it defines: .*dumps"),
        ("json:dumps.nope", r"'json:dumps\.nope': 'dumps' has no attribute 'nope'"),
        ("missing/file.py:f", r"task module file not found: missing/file\.py"),
    ],
)
def test_load_object_errors(spec, message):
    with pytest.raises(UserTaskError, match=message):
        load_object(spec)


def test_load_object_errors_in_user_code(tmp_path):
    broken = write(tmp_path / "broken.py", "def f(:\n    pass\n")
    with pytest.raises(UserTaskError, match=r"broken\.py has a syntax error at line 1") as info:
        load_object(f"{broken}:f")
    assert isinstance(info.value.__cause__, SyntaxError)
    raising = write(tmp_path / "raising.py", "raise RuntimeError('no data yet')\n")
    with pytest.raises(UserTaskError, match=r"running .*raising\.py raised RuntimeError: no data yet"):
        load_object(f"{raising}:f")
    importer = write(tmp_path / "importer.py", "import no_such_dependency_xyz\n")
    with pytest.raises(UserTaskError, match="No module named 'no_such_dependency_xyz'"):
        load_module(importer)
    assert isinstance(UserTaskError("x"), ValueError)


# ---------------------------------------------------------------------------------------------------
# User tasks


def test_example_user_task_end_to_end():
    task = load_user_task(str(EXAMPLE_MODULE), data=str(EXAMPLE_DATA))
    assert (task.name, task.num_agents, task.reward_range) == ("my_task", 2, (0.0, 1.0))
    assert task.title.startswith("Topic and praise")
    items = task.train_items()
    assert len(items) == 12 and task.eval_items() == []
    items[0]["topic"] = "changed"  # callers get fresh dicts
    assert task.train_items()[0]["topic"] == "rain"

    batch = task.train_items()[:3]
    prompts = format_prompts(task.formatters, batch)
    assert prompts[0][0] == "Write one sentence about the rain in winter."
    assert prompts[1][1] == "Say something good about the garden in one sentence."
    completions = [
        ["The rain falls.", "A garden.", "same"],
        ["What a lovely day.", "It is bad.", "same"],
    ]
    raw = call_reward_function(task.reward_func, completions, prompts=prompts, batch_items=batch)
    assert raw == pytest.approx([1.0, 0.6, 0.0])  # topic + good word + distinct; topic + distinct; identical
    assert apply_reward_processor(task.reward_processor, raw) == raw


def test_example_module_data_path_convention_and_spec():
    task = UserTaskSpec(reward="examples/custom_task/my_task.py:reward_func").build()
    assert len(task.train_items()) == 12  # DATA_PATH is relative to the module file
    spec = UserTaskSpec(module=str(EXAMPLE_MODULE), data_path=str(EXAMPLE_DATA), eval_data_path=str(EXAMPLE_DATA))
    assert UserTaskSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert len(spec.build().eval_items()) == 12


def test_user_task_is_a_task():
    from comlrl_lab.data.tasks import Task
    from comlrl_lab.data.user_tasks import UserTask

    task = load_user_task(str(EXAMPLE_MODULE))
    assert isinstance(task, Task) and isinstance(task, UserTask)
    assert pickle.loads(pickle.dumps(UserTaskSpec(module="m.py"))) == UserTaskSpec(module="m.py")


def test_user_module_conventions(tmp_path):
    write(
        tmp_path / "triple.py",
        '''
        """Three agents count words."""
        from comlrl_lab.data.rewards import RewardProcessors
        NUM_AGENTS = 3
        REWARD_RANGE = (0, 30)
        formatters = lambda item: item["question"]
        def score(a, b, c):
            return [len(a[0]) + len(b[0]) + len(c[0])]
        reward_processor = RewardProcessors.scale(0.5)
        ''',
    )
    data = write(tmp_path / "items.csv", "question\nwhy\nhow\n")
    task = load_user_task(tmp_path / "triple.py", data=data, reward="score", name="triple3")
    assert (task.name, task.num_agents, task.reward_range) == ("triple3", 3, (0.0, 30.0))
    assert task.description == "Three agents count words."
    assert [f({"question": "q"}) for f in task.formatters] == ["q", "q", "q"]
    raw = call_reward_function(task.reward_func, [["ab"], ["c"], ["def"]])
    assert apply_reward_processor(task.reward_processor, raw) == [3.0]


def test_user_task_without_formatters_needs_prompt_key(tmp_path):
    write(tmp_path / "plain.py", "def reward_func(a, b):\n    return [0.0]\n")
    good = write(tmp_path / "good.jsonl", '{"prompt": "x"}\n')
    bad = write(tmp_path / "bad.jsonl", '{"prompt": "x"}\n{"question": "y"}\n')
    task = load_user_task(tmp_path / "plain.py", data=good)
    assert task.num_agents == 2 and task.reward_range is None
    with pytest.raises(ValueError, match=r"bad\.jsonl: item 1 has no 'prompt' key"):
        load_user_task(tmp_path / "plain.py", data=bad)


def test_user_task_errors(tmp_path):
    write(tmp_path / "norew.py", "formatters = [str, str]\n")
    write(tmp_path / "three.py", "formatters = [str, str, str]\ndef reward_func(*c):\n    return [0.0]\n")
    data = write(tmp_path / "d.jsonl", '{"prompt": "x"}\n')
    with pytest.raises(UserTaskError, match="no reward function; define reward_func"):
        load_user_task(tmp_path / "norew.py", data=data)
    with pytest.raises(UserTaskError, match="reward_func must be a callable"):
        load_user_task(tmp_path / "norew.py", data=data, reward="formatters")
    with pytest.raises(UserTaskError, match="Number of formatters must match num_agents when providing a sequence"):
        load_user_task(tmp_path / "three.py", data=data, num_agents=2)
    with pytest.raises(UserTaskError, match="no training data"):
        load_user_task(tmp_path / "three.py")
    with pytest.raises(UserTaskError, match="has no attribute 'nope'"):
        load_user_task(tmp_path / "three.py", data=data, reward="nope")
    with pytest.raises(UserTaskError, match="needs module or reward"):
        UserTaskSpec()
    with pytest.raises(UserTaskError, match="needs a module"):
        UserTaskSpec(reward="reward_func")
    with pytest.raises(UserTaskError, match="unknown user task fields"):
        UserTaskSpec.from_dict({"module": "m.py", "oops": 1})
