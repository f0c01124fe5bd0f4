"""The four preference-trainer configs: CoMLRL 1.4.3's fields, defaults, aliases and validation messages.

``MADPOConfig`` holds everything the trainers share, ``MARLHFConfig`` adds reward-model and online-RL
fields, and ``_IterativePreferenceConfig`` adds the comparator and replay-buffer fields of the two Iter
configs. Every field carries ``metadata["help"]``, the one text shown as UI tooltip, CLI help and docs, and
``metadata["group"]``, the section the Setup form and the docs put it in.

The config is the only validator: ``__post_init__`` checks every field and raises ``ConfigError`` (a
``ValueError`` whose message is CoMLRL's where CoMLRL has one) naming the field it is about; the code below the
config takes the typed config and trusts it. The metadata holds the rest of what a field is:

- ``"choices"`` (the canonical values), ``"aliases"`` (other spelling -> canonical value), ``"choice_help"``
  (a note per value), ``"exact"`` (no case folding), ``"refusal"`` (CoMLRL's wording of an unknown name, when it
  is not "must be one of") and ``"suggest"`` (an unknown name gets a did-you-mean hint). These are the only lists
  of allowed values: validation, the text codec (``fields.py``), the Setup form and the docs read them.
- ``"applies_when"`` (controlling field -> the values under which the field means anything). With ``"strict"``
  the config refuses the field set elsewhere (``"tolerated"``: a value CoMLRL lets through under a controlling
  value anyway) and, with ``"required"``, left empty where it applies. The Setup form hides a field that does not
  apply and leaves it out.
- ``"suggested"`` (what the form fills in when the field becomes required), ``"none_means"`` (what None
  stands for) and ``"symbol"`` (the paper's name of the value, for short labels: k, λ).

This module does not import torch, resolve devices, read the environment or touch the file system: a
config can be built, checked and serialised anywhere (the Streamlit form, the CLI, a notebook).

Fields of our own (``seed``, ``disable_dropout``, ``score_final_token``, batch sizes, ``output_dir``,
``max_grad_norm``, ``bt_validation_fraction``, API retry/concurrency settings) are keyword-only, so the
positional order of CoMLRL's fields is unchanged. See docs/differences_from_comlrl.md.
"""

from __future__ import annotations

from comlrl_lab.trainers.preference.config.iterative import CONFIG_CLASSES, MADPOIterConfig, MARLHFIterConfig
from comlrl_lab.trainers.preference.config.madpo import MADPOConfig
from comlrl_lab.trainers.preference.config.marlhf import MARLHFConfig
from comlrl_lab.trainers.preference.config.validation import (
    DEFAULT_JUDGE_TEMPLATE,
    DEFAULT_LABEL_GUIDELINE,
    JUDGE_PLACEHOLDERS,
    MAGRPO_FAMILY_ADVANTAGE_MODE,
    MASK,
    SECRET_FIELDS,
    ConfigError,
    check_choice,
    check_field_names,
    choose,
    dependents,
    field_aliases,
    field_choices,
    field_multi_choices,
    resolve,
    resolve_choice,
)

__all__ = [
    "CONFIG_CLASSES",
    "DEFAULT_JUDGE_TEMPLATE",
    "DEFAULT_LABEL_GUIDELINE",
    "JUDGE_PLACEHOLDERS",
    "MAGRPO_FAMILY_ADVANTAGE_MODE",
    "MASK",
    "ConfigError",
    "MADPOConfig",
    "MADPOIterConfig",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "SECRET_FIELDS",
    "check_choice",
    "check_field_names",
    "choose",
    "dependents",
    "field_aliases",
    "field_choices",
    "field_multi_choices",
    "resolve",
    "resolve_choice",
]
