"""scripts/comlrl_suite.py: which of CoMLRL's test imports are ported to ours, and which stay CoMLRL's."""

from __future__ import annotations

from repo_scripts import load_repo_script

suite = load_repo_script("scripts/comlrl_suite.py", "comlrl_suite_script")


def test_public_preference_names_come_from_comlrl_lab_whichever_module_they_were_taken_from():
    source = (
        "from comlrl.trainers.preference import (\n    MADPOConfig,\n    MADPOTrainer,\n)\n"
        "from comlrl.trainers.preference.marlhf import JointRewardModel\n"
        "from comlrl.trainers.reinforce import MAGRPOTrainer\n"
    )
    assert suite.port_imports(source) == (
        "from comlrl_lab.trainers.preference import (MADPOConfig, MADPOTrainer)\n"
        "from comlrl_lab.trainers.preference import (JointRewardModel)\n"
        "from comlrl.trainers.reinforce import MAGRPOTrainer\n"
    )


def test_private_names_and_comlrls_own_modules_keep_their_comlrl_import():
    private = "from comlrl.trainers.preference.checkpointing import (\n    _resume_output_path,\n    save_assets,\n)\n"
    modules = "from comlrl.trainers.preference import (\n    MADPOIterTrainer,\n    checkpointing,\n)\n"
    assert suite.port_imports(private) == private
    assert suite.port_imports(modules) == modules
