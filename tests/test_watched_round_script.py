"""benchmarks/watched_round.py: which rounds it times and how it reads their times from a run's phase commits."""

from __future__ import annotations

import pandas as pd
import pytest
from repo_scripts import load_repo_script

from comlrl_lab.engine.run import SNAPSHOT_DIR


@pytest.fixture(scope="module")
def bench():
    return load_repo_script("benchmarks/watched_round.py", "watched_round_benchmark")


def _write_rounds(run_dir, evaluate_seconds: dict[int, float | None]) -> None:
    start = pd.Timestamp("2026-12-07 01:00:00")
    rounds = pd.DataFrame(
        {
            "round": list(evaluate_seconds),
            "evaluate_at": [None if s is None else start + pd.Timedelta(seconds=s) for s in evaluate_seconds.values()],
        }
    )
    (run_dir / SNAPSHOT_DIR).mkdir(parents=True, exist_ok=True)
    rounds.to_parquet(run_dir / SNAPSHOT_DIR / "rounds.parquet")


def test_rounds_two_to_n_are_timed_from_one_evaluate_commit_to_the_next(bench, tmp_path):
    _write_rounds(tmp_path, {1: 30.0, 2: 45.5, 3: 60.0, 4: 76.25})
    assert bench.round_times(tmp_path, 4) == [15.5, 14.5, 16.25]
    assert bench.round_times(tmp_path, 2) == [15.5]


def test_a_run_whose_last_round_has_not_finished_has_no_times_yet(bench, tmp_path):
    assert bench.round_times(tmp_path, 3) is None  # no snapshot yet
    _write_rounds(tmp_path, {1: 30.0, 2: 45.5, 3: None})
    assert bench.round_times(tmp_path, 3) is None
    assert bench.round_times(tmp_path, 4) is None


def test_the_app_to_cli_ratio_is_judged_against_its_own_target(bench):
    line, value, (low, high) = bench.ratio_line("app (page closed) / cli", [10.4, 10.6, 10.5], [10.0, 9.9, 10.1], 1.05)
    assert value == pytest.approx(1.05) and line.startswith("app (page closed) / cli: 1.050, 95% interval ")
    assert line.endswith("(meets the target <= 1.05)")
    # Every resample's ratio lies between the smallest top over the largest bottom and the other way round.
    assert 10.4 / 10.1 <= low <= value <= high <= 10.6 / 9.9
    line, _, interval = bench.ratio_line("app (page open) / cli", [11.0], [10.0], 1.05)
    assert interval == pytest.approx((1.1, 1.1))  # one value a side: nothing to resample
    assert line == "app (page open) / cli: 1.100, 95% interval 1.100-1.100 (misses the target <= 1.05)"


def test_the_interval_of_the_ratio_of_medians_widens_with_the_spread_of_the_rounds(bench):
    steady = bench.ratio_interval([10.0, 10.1, 9.9, 10.0, 10.05], [10.0, 9.95, 10.05, 10.0, 10.1])
    spread = bench.ratio_interval([9.0, 11.0, 10.0, 8.5, 11.5], [10.0, 9.0, 11.0, 11.5, 8.5])
    assert spread[1] - spread[0] > 5 * (steady[1] - steady[0])
    assert bench.ratio_interval([1.0, 2.0, 3.0], [1.0]) == bench.ratio_interval([1.0, 2.0, 3.0], [1.0])  # seeded


def test_fewer_than_two_rounds_is_refused(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "1"])
    assert "--rounds must be at least 2" in capsys.readouterr().err
