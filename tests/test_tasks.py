"""Built-in tasks: registry, item files, formatters and rewards checked against answers worked out by hand."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest

from comlrl_lab.data.tasks import Task, get_task, list_tasks, list_word_tasks, load_object
from comlrl_lab.data.tasks.generate import DATA_DIR, make_items
from comlrl_lab.data.tasks.length_ratio import length_ratio_reward
from comlrl_lab.data.tasks.lexicon import TOPICS, polarity
from comlrl_lab.data.tasks.stance_agreement import stance_agreement_reward
from comlrl_lab.data.tasks.topic_relay import topic_relay_reward

TASK_NAMES = list_word_tasks()  # the code task has tests of its own (test_humaneval_task.py)
RAIN = {
    "id": "x",
    "prompt": "Topic: rain in winter. Write about rain.\nAnswer:",
    "topic": "rain",
    "setting": "in winter",
}


def test_registry_lists_at_least_three_tasks_including_length_ratio():
    assert len(TASK_NAMES) >= 3
    assert list_tasks()[:3] == TASK_NAMES[:3] == ["length_ratio", "topic_relay", "stance_agreement"]
    for name in TASK_NAMES:
        task = get_task(name)
        assert isinstance(task, Task) and task.name == name
        assert task.num_agents == 2 == len(task.formatters)
        assert task.reward_range == (0.0, 1.0) == task.reward_func.reward_range
        assert task.reward_func.supports_batch is True
        assert task.title and task.description


def test_unknown_task_names_the_available_ones():
    with pytest.raises(ValueError, match="unknown task 'nope'.*length_ratio, topic_relay, stance_agreement, humaneval"):
        get_task("nope")


@pytest.mark.parametrize("name", TASK_NAMES)
def test_items_counts_fields_and_disjoint_splits(name):
    task = get_task(name)
    train, evaluation = task.train_items(), task.eval_items()
    assert len(train) >= 200 and len(evaluation) >= 50
    for item in train + evaluation:
        assert isinstance(item["prompt"], str) and item["prompt"].endswith("\nAnswer:")
        assert item["topic"] in TOPICS
        assert item["prompt"].startswith(f"Topic: {item['topic']} {item['setting']}.")
    assert len({i["id"] for i in train + evaluation}) == len(train) + len(evaluation)

    def key(item):
        return (item["topic"], item["setting"], item.get("stance"))

    assert not {key(i) for i in train} & {key(i) for i in evaluation}


@pytest.mark.parametrize("name", TASK_NAMES)
def test_committed_item_files_are_what_the_generator_writes(name):
    for split, items in make_items(name).items():
        lines = (DATA_DIR / f"{name}_{split}.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == items


def test_items_are_fresh_copies():
    task = get_task("length_ratio")
    task.train_items()[0]["prompt"] = "changed"
    assert task.train_items()[0]["prompt"] != "changed"


def test_formatters_give_each_agent_its_own_prompt():
    assert get_task("length_ratio").prompts(RAIN) == [
        "Agent 1 of 2. Topic: rain in winter. Write a short answer about rain.\nAnswer:",
        "Agent 2 of 2. Topic: rain in winter. Write an answer about rain, twice as long as agent 1's.\nAnswer:",
    ]
    assert get_task("topic_relay").prompts(RAIN) == [
        "Agent 1 of 2. Topic: rain in winter. Say something about rain.\nAnswer:",
        "Agent 2 of 2. Topic: rain in winter. Say something new about rain, in words agent 1 does not use.\nAnswer:",
    ]
    item = {**RAIN, "stance": "negative"}
    assert get_task("stance_agreement").prompts(item) == [
        "Agent 1 of 2. Topic: rain in winter. Stance: negative. Give a negative opinion about rain.\nAnswer:",
        "Agent 2 of 2. Topic: rain in winter. Stance: negative. Give a reason for a negative view of rain.\nAnswer:",
    ]


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ("one two three", "one two three four five six", 1.0),  # ratio 2
        ("one two three", "one two three", 0.5),  # ratio 1: 1 - 1/2
        ("one two", "one", 0.25),  # ratio 0.5: 1 - 1.5/2
        ("one two", "a b c d e", 0.75),  # ratio 2.5: 1 - 0.5/2
        ("one two three", "a b c d e f g h i j k l", 0.0),  # ratio 4: clipped at 0
        ("", "one two", 0.0),
        ("one two", "   ", 0.0),
    ],
)
def test_length_ratio_known_answers(first, second, expected):
    assert length_ratio_reward([first], [second]) == [pytest.approx(expected)]


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        # Both name the topic; agent 2's content words {makes, green, fields, wet} are all new, at least three.
        ("The rain falls on the town.", "Rain makes the green fields wet.", 1.0),
        # Only agent 1 names it; agent 2's {town, falls, quiet, cold} repeats two: 1/2 * 2/4 * 2/3.
        ("The rain falls on the town.", "The town falls quiet and cold.", 1 / 6),
        # Plurals count as the topic; agent 2's {came, fast} are new but only two: 1 * 1 * 2/3.
        ("Rains again.", "Rains came fast.", 2 / 3),
        # Five new words count as three.
        ("The rain.", "Rain makes the green fields wet today.", 1.0),
        ("The town is quiet.", "The hills are green.", 0.0),  # nobody names the topic
        ("The rain.", "the rain is the rain", 0.0),  # no content word from agent 2
        ("", "The rain.", 0.0),
    ],
)
def test_topic_relay_known_answers(first, second, expected):
    assert topic_relay_reward([first], [second], batch_items=[RAIN]) == [pytest.approx(expected)]


def compound(valence_sum: float) -> float:
    """VADER's normalisation of a sentence's summed valences (its documented alpha = 15)."""
    return valence_sum / math.sqrt(valence_sum**2 + 15)


# Valences from VADER's lexicon: lovely 2.8, warm 0.9, great 3.1, awful -2.0, sad -2.1, clean 1.7; a negation
# ("not") scales the next word's valence by -0.74.
@pytest.mark.parametrize(
    ("stance", "first", "second", "expected"),
    [
        ("positive", "A lovely warm day.", "The red door.", 0.4 * compound(2.8 + 0.9)),  # agent 2 neutral: no agreement
        ("negative", "An awful road.", "The sad town.", 0.4 * -compound(-2.0) + 0.4 * -compound(-2.1) + 0.2),
        ("negative", "A lovely day.", "A great town.", 0.2),  # they agree, on the wrong stance
        ("negative", "A lovely day.", "An awful town.", 0.4 * -compound(-2.0)),
        # Negation: "not clean" is negative, where counting words would call it positive.
        (
            "negative",
            "The river is not clean.",
            "An awful road.",
            0.4 * -compound(-0.74 * 1.7) + 0.4 * -compound(-2.0) + 0.2,
        ),
        ("positive", "The red door.", "", 0.0),
    ],
)
def test_stance_agreement_known_answers(stance, first, second, expected):
    item = {**RAIN, "stance": stance}
    assert stance_agreement_reward([first], [second], batch_items=[item]) == [pytest.approx(expected, abs=1e-4)]


def test_polarity_reads_english_beyond_the_tiny_corpus():
    assert polarity("The festival was absolutely wonderful and everyone smiled.") > 0.5
    assert polarity("The museum was crowded, dirty and disappointing.") < -0.5
    assert polarity("The train leaves at noon.") == 0.0
    assert polarity("I don't like the harbor.") < 0 < polarity("I like the harbor.")


@pytest.mark.parametrize("name", TASK_NAMES)
def test_batched_call_returns_one_reward_per_joint_response(name):
    task = get_task(name)
    items = task.eval_items()[:3]
    first = ["The rain is lovely.", "", "An awful storm falls on the town today."]
    second = ["Rain makes the green fields wet and happy.", "The sad lake.", "I hate the storm."]
    batched = task.reward_func(first, second, batch_items=items)
    one_by_one = [task.reward_func([a], [b], batch_items=[it])[0] for a, b, it in zip(first, second, items)]
    assert len(batched) == 3 and batched == one_by_one
    # One item for every response, as a caller scoring many candidates of one item passes it.
    assert task.reward_func(first, second, batch_items=items[:1]) == [
        task.reward_func([a], [b], batch_items=items[:1])[0] for a, b in zip(first, second)
    ]
    # Without items, the fields are read back from the prompts the formatters wrote.
    prompts = [task.formatters[0](it) for it in items]
    assert task.reward_func(first, second, prompts=prompts) == batched
    with pytest.raises(ValueError, match="one completion per agent"):
        task.reward_func(first, second[:2], batch_items=items)


def test_item_fields_are_required_when_the_reward_needs_them():
    with pytest.raises(ValueError, match="pass batch_items or prompts"):
        topic_relay_reward(["a"], ["b"])
    with pytest.raises(ValueError, match="batch_items must hold 1 or 2 items"):
        stance_agreement_reward(["a", "b"], ["c", "d"], batch_items=[{}, {}, {}])


@pytest.mark.parametrize("name", TASK_NAMES)
def test_rewards_stay_in_range_on_random_text(name):
    task = get_task(name)
    rng = random.Random(0)
    tones = ["good", "lovely", "happy", "calm", "bad", "awful", "sad", "noisy", "not", "very", "but"]
    pool = tones + list(TOPICS[:10]) + ["the", "is", "and", "big", "old", "x"]
    items = task.eval_items()
    texts = [" ".join(rng.choice(pool) for _ in range(rng.randint(0, 25))) for _ in range(400)]
    rewards = task.reward_func(texts[:200], texts[200:], batch_items=[items[j % len(items)] for j in range(200)])
    assert all(0.0 <= r <= 1.0 for r in rewards)
    assert len(set(rewards)) > 5  # the rewards spread; they are not a constant


def test_load_object_resolves_and_explains():
    assert load_object("comlrl_lab.data.tasks.length_ratio:length_ratio_reward") is length_ratio_reward
    assert load_object("comlrl_lab.data.tasks:get_task") is get_task
    assert load_object("comlrl_lab.data.tasks.length_ratio:TASK.reward_func") is length_ratio_reward
    with pytest.raises(ValueError, match="expected 'package.module:attribute'"):
        load_object("comlrl_lab.data.tasks.get_task")
    with pytest.raises(ValueError, match="cannot find module"):
        load_object("no_such_module_xyz:f")
    with pytest.raises(ValueError, match="has no attribute"):
        load_object("comlrl_lab.data.tasks:nothing_here")


def test_tasks_do_not_import_torch():
    code = (
        "import sys, comlrl_lab.data.tasks as t; t.get_task('topic_relay').train_items(); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
