"""A stop asked for during sampling lands within a decode step, not after a generate call that takes minutes on a CPU.

``SamplingSettings.interrupt`` is called before every generate call and every step, on our decode loop and on
transformers' generate (row-seeded or from a stream); what it raises ends the call. A trainer's sampling calls its
control's ``check_cancel``, so a phase stopped mid-generation raises ``PhaseCancelled`` at the next step.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from comlrl_lab.models import generation
from comlrl_lab.models.loading import load_model, load_tokenizer
from comlrl_lab.models.tiny_model import tiny_model_path
from comlrl_lab.trainers.preference.runtime.sink import PhaseCancelled, PhaseControl

PROMPTS = ["the red cat sat on the mat", "a dog"]
SETTINGS = generation.SamplingSettings(max_new_tokens=40, temperature=1.5, top_p=1.0, top_k=None, batch_size=8)
#: (row seeds, the sampling settings' switches): our decode loop, generate row-seeded, generate from a stream.
PATHS = {
    "own decode loop": ([3, 4], {}),
    "generate, row-seeded": ([3, 4], {"own_decode_loop": False}),
    "generate, from a stream": (None, {}),
}


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def tiny():
    folder = tiny_model_path()
    return load_model(folder, device="cpu", dtype="float32").eval(), load_tokenizer(folder)


def _sample(tiny, path: str, interrupt=None):
    model, tokenizer = tiny
    row_seeds, switches = PATHS[path]
    settings = dataclasses.replace(SETTINGS, interrupt=interrupt, **switches)
    generator = None if row_seeds else torch.Generator().manual_seed(0)
    rows = generation.sample_candidates(model, tokenizer, PROMPTS, 4, settings, generator, row_seeds=row_seeds)
    return [[candidate.completion_ids for candidate in row] for row in rows]


@pytest.mark.parametrize("path", PATHS)
def test_what_the_interrupt_raises_ends_the_call_within_a_step(tiny, path):
    calls: list[int] = []
    forwards: list[int] = []

    def interrupt():
        calls.append(len(forwards))
        if len(calls) == 4:
            raise Stop

    model, _ = tiny
    hook = model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        with pytest.raises(Stop):
            _sample(tiny, path, interrupt)
    finally:
        hook.remove()
    # Once before the generate call, then once a step: the fourth call, with at most 4 forwards run (a prefill
    # of the shared prompts, then one a step), raised; sampling all 40 tokens would take 40 or more.
    assert len(calls) == 4 and calls[0] == 0
    assert len(forwards) <= 4
    assert calls == sorted(calls) and calls[-1] > calls[1]  # the checks came between forwards, not all up front


@pytest.mark.parametrize("path", PATHS)
def test_an_interrupt_that_does_not_raise_changes_no_token(tiny, path):
    calls: list[int] = []
    assert _sample(tiny, path, lambda: calls.append(1)) == _sample(tiny, path)
    assert len(calls) > SETTINGS.max_new_tokens // 2  # it was called along the way


def test_a_stop_asked_for_during_collect_ends_the_phase_at_the_next_step(make_trainer, tmp_path):
    """The trainer's sampling asks its control at every step: a stop that comes after the first forwards of the
    collect phase raises PhaseCancelled after at most one more forward, with 48 tokens a row still to go."""
    forwards: list[int] = []

    class StopAfterTwoForwards(PhaseControl):
        def cancel_requested(self) -> bool:
            return len(forwards) >= 2

    trainer = make_trainer("MADPOIter", tmp_path, num_iterations=1, max_new_tokens=48)
    trainer.control = StopAfterTwoForwards()
    hooks = [agent.register_forward_hook(lambda *_: forwards.append(1)) for agent in trainer.agents]
    try:
        with pytest.raises(PhaseCancelled, match="collect of round 1 was cancelled"):
            trainer.step()
    finally:
        for hook in hooks:
            hook.remove()
    assert len(forwards) <= 3
