"""Names vulture reports as unused that are used where it cannot see: keep this list short.

vulture reads this file as source; it is never imported. Each entry names the real object, so a rename shows up
here. Real dead code does not belong here: delete it instead.
"""

# ruff: noqa: B018  (every entry is a bare expression: that is how vulture sees a name as used)

import tokenizers
import transformers

from comlrl_lab import models
from comlrl_lab.data import user_tasks
from comlrl_lab.data.rewards import RewardProcessors
from comlrl_lab.models import cpu_matmul
from comlrl_lab.models.shared_prefix_cache import SharedPrefixCache
from comlrl_lab.sandbox import SandboxLimits, SandboxResult
from comlrl_lab.trainers.preference.base import PreferenceTrainerBase
from comlrl_lab.trainers.preference.config import MADPOConfig
from comlrl_lab.trainers.preference.runtime.devices import DeviceLayout
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

# Module __getattr__/__dir__ (PEP 562): Python calls them for lazy exports.
models.__getattr__
models.__dir__
user_tasks.__getattr__

# The lazily built UserTask class sets __module__ so pickle finds it by its public name.
user_tasks.UserTask.__module__

# Attributes of third-party tokenizers that we set and the library reads.
transformers.PreTrainedTokenizerBase.pad_token
tokenizers.Tokenizer.pre_tokenizer
tokenizers.Tokenizer.post_processor

# CoMLRL's public API, called from user scripts and notebooks.
RewardProcessors.scale
RewardProcessors.shift
PreferenceTrainerBase.save_model

# CoMLRL config fields accepted for compatibility; the UI, CLI and docs read every field through fields().
MADPOConfig.discount
MADPOConfig.early_termination_threshold
MADPOConfig.external_prompt_passthrough
MADPOConfig.log_reward_distribution

# Read by name: the replay buffer and the Replay page take the replay fields as REPLAY_FIELDS (the mode and the
# fields whose applies_when names it), under their config names.
MADPOConfig.preference_replay_k
MADPOConfig.preference_replay_lambda
MADPOConfig.preference_replay_sample_size

# DeviceLayout's roles are read through getattr over ROLES; as_strings is that readout, used by the layout tests.
DeviceLayout.current_copy
DeviceLayout.as_strings

# People's verdicts for a MemorySink run (the Python API, tests and notebooks give them; the store is the engine's).
MemorySink.give

# torch.autograd.Function calls setup_context itself; a module's class is swapped by assigning __class__.
cpu_matmul._OneDNNLinearFunction.setup_context
cpu_matmul.OneDNNLinear.__class__

# transformers' mask builders ask the cache for its mask sizes (the shared-prefix cache counts its prompt in them);
# its other DynamicCache edits are overridden to refuse.
SharedPrefixCache.get_mask_sizes
SharedPrefixCache.crop
SharedPrefixCache.batch_repeat_interleave
SharedPrefixCache.reorder_cache

# The sandbox's limits reach the launcher (a separate script) through dataclasses.asdict() in its JSON request; the
# truncation flags of a result are for callers that show a program's output (cut-off output is marked as such).
SandboxLimits.per_test_time_s
SandboxLimits.cpu_time_s
SandboxLimits.memory_bytes
SandboxLimits.max_processes
SandboxLimits.max_open_files
SandboxLimits.max_output_bytes
SandboxResult.stdout_truncated
SandboxResult.stderr_truncated
# CoMLRL's fields that only their declared bound reads (check_bound(self, name), by name).
MADPOConfig.logging_steps
MADPOConfig.eval_batch_size
