"""Replay buffer: lambda-decay weights, per-mode eligibility, sampling counts, files, run directories, state."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from comlrl_lab.data.records import PreferencePair, round_file_payload
from comlrl_lab.seeding import RandomStreams
from comlrl_lab.store.importer import parse_pair_file
from comlrl_lab.trainers.preference import MADPOIterConfig
from comlrl_lab.trainers.preference.rounds.replay import (
    REPLAY_FIELDS,
    RUN_MARKER,
    ReplayBuffer,
    default_sample_size,
    draw_replay_sample,
    lambda_decay_weights,
    replay_weights,
)


def make_pairs(round_index: int, count: int) -> list[PreferencePair]:
    return [
        PreferencePair(
            prompts=["問題 p", "q"],
            winner_completions=[f"勝ち r{round_index} #{n}", "w"],
            loser_completions=[f"負け r{round_index} #{n}", "l"],
            winner_reward=1.0 + n,
            loser_reward=0.5,
            candidate_reward_mean=0.75,
            raw_rewards=[2.0 + n, 1.0],
            target_raw_reward=2.0 + n,
            comparator_raw_reward=1.0,
            round_index=round_index,
            item_index=n,
            winner_candidate_index=n,
            loser_candidate_index=n,
            winner_side="current",
            prompt_ids=[[1, 2], [3]],
            winner_ids=[[10 + n, 2], [4]],
            loser_ids=[[20 + n], [5, 6]],
        )
        for n in range(count)
    ]


def replay_config(mode: str, k=None, lam=None, sample_size=None) -> MADPOIterConfig:
    """A validated config with these replay settings: what the buffer and the weights are given."""
    return MADPOIterConfig(
        preference_replay_mode=mode,
        preference_replay_k=k,
        preference_replay_lambda=lam,
        preference_replay_sample_size=sample_size,
    )


def settings(mode: str, **kwargs) -> dict:
    """The replay fields of ``replay_config``, as a run stores them."""
    config = replay_config(mode, **kwargs)
    return {name: getattr(config, name) for name in REPLAY_FIELDS}


def tags(pairs):
    return [(p.round_index, p.item_index) for p in pairs]


# ------------------------------------------------------------------------------------------------ weights
def test_lambda_decay_known_answers():
    assert lambda_decay_weights(3, 0.5) == pytest.approx([1 / 7, 2 / 7, 4 / 7])
    assert lambda_decay_weights(3, 0.0) == [0.0, 0.0, 1.0]
    assert lambda_decay_weights(3, 1.0) == pytest.approx([1 / 3] * 3)
    assert lambda_decay_weights(1, 0.3) == pytest.approx([1.0])
    assert lambda_decay_weights(0, 0.3) == []
    assert sum(lambda_decay_weights(7, 0.9)) == pytest.approx(1.0)


SIZES = {1: 3, 2: 0, 3: 2, 4: 5}


def flat(weights):
    """[(round, weight), ...] -> ([rounds], [weights]) so weights compare with pytest.approx (no nested tuples)."""
    return [r for r, _ in weights], pytest.approx([w for _, w in weights])


def test_replay_weights_every_mode():
    assert replay_weights(settings("current"), SIZES) == [(4, 1.0)]
    assert replay_weights(settings("current"), SIZES, current_round=2) == []  # empty round: nothing to train on
    assert replay_weights(settings("nearest_k", k=2), SIZES) == [(3, 0.5), (4, 0.5)]  # the empty round 2 is skipped
    rounds, weights = flat(replay_weights(settings("nearest_k", k=9), SIZES))
    assert rounds == [1, 3, 4] and weights == [1 / 3, 1 / 3, 1 / 3]
    rounds, weights = flat(replay_weights(settings("all_history"), SIZES))
    assert rounds == [1, 3, 4] and weights == [1 / 3, 1 / 3, 1 / 3]
    rounds, weights = flat(replay_weights(settings("lambda_decay", lam=0.5), SIZES))
    assert rounds == [1, 3, 4] and weights == [1 / 7, 2 / 7, 4 / 7]
    assert replay_weights(settings("lambda_decay", lam=0.0), SIZES) == [(1, 0.0), (3, 0.0), (4, 1.0)]
    # Rounds after current_round are not visible yet; the current round need not be non-empty.
    assert replay_weights(settings("all_history"), SIZES, current_round=3) == [(1, 0.5), (3, 0.5)]
    assert replay_weights(settings("nearest_k", k=1), {1: 4, 2: 0}, current_round=2) == [(1, 1.0)]
    # A mode's alias, or its k or λ missing, never gets here: the config refuses or resolves them (test_config).


def test_default_sample_size():
    assert default_sample_size(7, 3, 4) == 7
    assert default_sample_size(None, 3, 4) == 3
    assert default_sample_size(None, 0, 4) == 4
    assert default_sample_size(None, 0, None) == 0


# ----------------------------------------------------------------------------------------------- sampling
def test_draw_counts_sum_and_no_repeats_when_count_fits():
    datasets = {1: list(range(100)), 2: list(range(100, 200))}
    sample, drawn = draw_replay_sample(datasets, {1: 0.5, 2: 0.5}, 60, random.Random(3))
    assert sum(drawn.values()) == 60 == len(sample)
    assert len(set(sample)) == 60
    assert sum(1 for x in sample if x < 100) == drawn[1]


def test_draw_cycles_when_count_exceeds_dataset():
    sample, drawn = draw_replay_sample({1: ["a", "b", "c"]}, {1: 1.0}, 8, random.Random(5))
    assert drawn == {1: 8}
    counts = Counter(sample)
    assert sorted(counts.values()) == [2, 3, 3]  # floor(8/3) or ceil(8/3) each, 8 mod 3 = 2 at the ceiling


def test_draw_zero_weight_and_empty_cases():
    sample, drawn = draw_replay_sample({1: [1, 2], 2: [3, 4]}, {1: 0.0, 2: 1.0}, 50, random.Random(1))
    assert drawn == {1: 0, 2: 50} and set(sample) == {3, 4}
    assert draw_replay_sample({1: [1]}, {1: 1.0}, 0, random.Random(1)) == ([], {1: 0})
    assert draw_replay_sample({1: []}, {1: 1.0}, 5, random.Random(1)) == ([], {})


def filled_buffer(mode, tmp_path=None, **kwargs) -> ReplayBuffer:
    buffer = ReplayBuffer(replay_config(mode, **kwargs), replay_dir=tmp_path, num_agents=2, run_id="run-a")
    for t, n in SIZES.items():
        buffer.add_round(t, make_pairs(t, n))
    return buffer


def test_select_current_returns_the_round_as_is():
    buffer = filled_buffer("current")
    selection = buffer.select(4, random.Random(0))
    assert selection.pairs == make_pairs(4, 5)  # same order, no sampling
    assert selection.weights == {4: 1.0} and selection.drawn == {4: 5}
    empty = buffer.select(2, random.Random(0))
    assert empty.pairs == [] and empty.weights == {} and empty.drawn == {}


@pytest.mark.parametrize(
    ("mode", "kwargs", "eligible"),
    [
        ("nearest_k", {"k": 2}, {3, 4}),
        ("all_history", {}, {1, 3, 4}),
        ("lambda_decay", {"lam": 0.5}, {1, 3, 4}),
        ("lambda_decay", {"lam": 0.0}, {4}),
    ],
)
def test_select_modes_draw_only_from_eligible_rounds(mode, kwargs, eligible):
    buffer = filled_buffer(mode, sample_size=400, **kwargs)
    selection = buffer.select(4, RandomStreams(1).python("replay"))
    assert len(selection.pairs) == 400 == sum(selection.drawn.values())
    assert {t for t, c in selection.drawn.items() if c > 0} == eligible
    assert {p.round_index for p in selection.pairs} == eligible
    assert sum(selection.weights.values()) == pytest.approx(1.0)
    for t, count in selection.drawn.items():
        assert sum(1 for p in selection.pairs if p.round_index == t) == count


def test_select_default_size_and_shuffle():
    buffer = filled_buffer("all_history")
    assert len(buffer.select(4, random.Random(0)).pairs) == 5  # this round's count
    assert len(buffer.select(2, random.Random(0)).pairs) == 3  # empty round -> latest non-empty (round 1)
    nothing = ReplayBuffer(replay_config("all_history"), run_id="x")
    nothing.add_round(1, [])
    assert nothing.select(1, random.Random(0)).pairs == []


def test_select_same_seed_same_sample():
    buffer = filled_buffer("lambda_decay", lam=0.7, sample_size=9)
    a = buffer.select(4, RandomStreams(42).python("replay"))
    b = buffer.select(4, RandomStreams(42).python("replay"))
    assert tags(a.pairs) == tags(b.pairs) and a.drawn == b.drawn
    assert tags(a.pairs) != tags(buffer.select(4, RandomStreams(43).python("replay")).pairs)


def test_buffer_refuses_a_run_id_that_is_not_one_folder_name_and_round_zero():
    with pytest.raises(ValueError, match="run_id"):
        ReplayBuffer(replay_config("current"), run_id="../escape")
    with pytest.raises(ValueError, match="iteration"):
        ReplayBuffer(replay_config("current"), run_id="x").add_round(0, [])


# ---------------------------------------------------------------------------------------------------- files
def test_round_files_are_byte_exact(tmp_path):
    buffer = filled_buffer("current", tmp_path)
    assert buffer.replay_dir == tmp_path
    for t, n in SIZES.items():
        expected = json.dumps(round_file_payload(t, make_pairs(t, n)), ensure_ascii=False).encode("utf-8")
        assert (tmp_path / f"iteration_{t:04d}.json").read_bytes() == expected
    assert json.loads((tmp_path / "iteration_0002.json").read_text(encoding="utf-8")) == {
        "iteration": 2,
        "num_pairs": 0,
        "pairs": [],
    }
    assert "勝ち" in (tmp_path / "iteration_0001.json").read_text(encoding="utf-8")  # ensure_ascii=False
    assert not list(tmp_path.glob("*.tmp"))
    assert (tmp_path / RUN_MARKER).read_text(encoding="utf-8").strip() == "run-a"


def test_round_files_read_back(tmp_path):
    # The store's importer is the one reader of round files; a written round must come back through it unchanged.
    filled_buffer("current", tmp_path)
    path = tmp_path / "iteration_0004.json"
    iteration, pairs = parse_pair_file(path.name, path.read_bytes())
    assert iteration == 4 and [p.to_record() for p in pairs] == [p.to_record() for p in make_pairs(4, 5)]
    assert not any(p.has_token_ids for p in pairs)


def test_never_overwrites_another_run(tmp_path):
    first = filled_buffer("current", tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}

    second = ReplayBuffer(replay_config("current"), replay_dir=tmp_path, run_id="run-b")
    second.add_round(1, make_pairs(1, 1))
    assert second.replay_dir == tmp_path / "run-run-b"
    assert (second.replay_dir / "iteration_0001.json").exists()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before

    resumed = ReplayBuffer(
        replay_config("current"), replay_dir=tmp_path, run_id="run-a"
    )  # same run id: continues in place
    assert resumed.replay_dir == first.replay_dir == tmp_path
    resumed_b = ReplayBuffer(replay_config("current"), replay_dir=tmp_path, run_id="run-b")
    assert resumed_b.replay_dir == second.replay_dir


def test_comlrl_directory_without_marker_is_left_alone(tmp_path):
    old = tmp_path / "iteration_0001.json"
    old.write_text('{"iteration": 1, "num_pairs": 0, "pairs": []}', encoding="utf-8")
    buffer = ReplayBuffer(replay_config("all_history"), replay_dir=tmp_path, run_id="fresh")
    buffer.add_round(1, make_pairs(1, 2))
    assert buffer.replay_dir == tmp_path / "run-fresh"
    assert old.read_text(encoding="utf-8") == '{"iteration": 1, "num_pairs": 0, "pairs": []}'
    assert buffer.round_sizes == {1: 2}  # an old directory is never imported


def test_empty_directory_without_marker_is_claimed(tmp_path):
    (tmp_path / "notes.txt").write_text("unrelated", encoding="utf-8")
    buffer = ReplayBuffer(replay_config("current"), replay_dir=tmp_path / "new" / "replay", run_id="r1")
    assert buffer.replay_dir == tmp_path / "new" / "replay" and buffer.replay_dir.is_dir()
    assert ReplayBuffer(replay_config("current"), replay_dir=tmp_path, run_id="r2").replay_dir == tmp_path


# ---------------------------------------------------------------------------------------------------- state
def test_state_round_trip_restores_index_and_data(tmp_path):
    buffer = filled_buffer("lambda_decay", tmp_path, lam=0.5, sample_size=6)
    state = json.loads(json.dumps(buffer.state_dict()))  # must survive JSON
    for path in tmp_path.glob("iteration_000[34].json"):
        path.unlink()

    restored = ReplayBuffer(
        replay_config("lambda_decay", lam=0.5, sample_size=6), replay_dir=tmp_path, num_agents=2, run_id="run-a"
    )
    restored.load_state_dict(state)
    assert restored.round_sizes == buffer.round_sizes == {1: 3, 2: 0, 3: 2, 4: 5}
    for t in SIZES:
        assert restored.round_pairs(t) == buffer.round_pairs(t)  # records, provenance and token ids
    assert restored.round_pairs(4)[0].winner_ids == [[10, 2], [4]]
    a = buffer.select(4, RandomStreams(5).python("replay"))
    b = restored.select(4, RandomStreams(5).python("replay"))
    assert a.pairs == b.pairs and a.weights == b.weights and a.drawn == b.drawn
    # Missing round files are written again, byte-exact.
    expected = json.dumps(round_file_payload(4, make_pairs(4, 5)), ensure_ascii=False).encode("utf-8")
    assert (tmp_path / "iteration_0004.json").read_bytes() == expected


def test_load_adopts_the_checkpointed_run_and_its_directory(tmp_path):
    original = filled_buffer("all_history", tmp_path)
    state = original.state_dict()
    fresh = ReplayBuffer(replay_config("all_history"), replay_dir=tmp_path, num_agents=2, run_id="fresh-id")
    assert fresh.replay_dir == tmp_path / "run-fresh-id"
    fresh.load_state_dict(state)
    assert fresh.run_id == "run-a" and fresh.replay_dir == tmp_path
    assert not (tmp_path / "run-fresh-id").exists()  # the unused claim is given back
    fresh.add_round(5, make_pairs(5, 1))
    assert (tmp_path / "iteration_0005.json").exists()


def test_run_ids_may_be_any_single_path_component(tmp_path):
    assert (
        ReplayBuffer(replay_config("current"), replay_dir=tmp_path, run_id="実験-20250101-ab12").run_id
        == "実験-20250101-ab12"
    )
    for bad in ("a/b", "..", "", "x\ny", "a\\b"):
        with pytest.raises(ValueError, match="run_id"):
            ReplayBuffer(replay_config("current"), run_id=bad)


def test_load_rejects_unknown_state():
    buffer = ReplayBuffer(replay_config("current"), run_id="x")
    with pytest.raises(ValueError, match="version"):
        buffer.load_state_dict({"version": 99, "rounds": []})
