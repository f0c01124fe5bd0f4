"""benchmarks/reward_fit.py: config 3's pair shape, and both ways of running the reward model's last layer."""

from __future__ import annotations

import subprocess
import sys

from repo_scripts import ROOT, load_repo_script


def test_the_pairs_are_the_length_ratio_tasks_joint_texts_of_two_agents():
    bench = load_repo_script("benchmarks/reward_fit.py", "reward_fit_benchmark")
    prompts, pairs, scored = bench.joint_pairs(3)

    assert len(prompts) == len(pairs) == len(scored) == 3
    for item_prompts, (winner, loser), responses in zip(prompts, pairs, scored):
        assert len(item_prompts) == len(responses) == 2
        assert winner != loser
        # The two joint texts share the header and agent 1's prompt, as the trainer's pairs do.
        assert (
            winner.startswith("Joint multi-agent response") and item_prompts[0] in winner and item_prompts[0] in loser
        )
        assert all(2 <= len(response.split()) <= 12 for response in responses)
    assert bench.joint_pairs(3) == (prompts, pairs, scored)  # seeded


def test_a_short_run_reports_both_ways_and_their_ratio():
    done = subprocess.run(
        [sys.executable, "benchmarks/reward_fit.py", "--pairs", "2", "--repeats", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith(("run ", "median"))]
    assert [line.split(":")[0] for line in lines] == ["run 1", "run 2", "median on / off over 2 pairs of runs"]
    assert "on: fit" in lines[0] and "off: fit" in lines[0] and "on / off: fit" in lines[1]
