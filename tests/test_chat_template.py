"""use_chat_template: prompts through a tokenizer's chat template, responses that end at the end of a turn.

The model with a template is the embedded one read back from the tiny GGUF the registry tests write: the same
weights, plus ``<|im_end|>`` and a ChatML template, as SmolLM2 has. The embedded model itself has no template,
so ``auto`` leaves it as it was.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf_fixtures import END_OF_TURN, write_tiny_gguf
from transformers import AutoTokenizer

from comlrl_lab.data.tasks import get_task
from comlrl_lab.models.chat import ChatFormatter, end_of_turn_ids, render_prompt, stop_at_end_of_turn
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME, tiny_model_path
from comlrl_lab.trainers.preference import MADPOIterConfig, MADPOIterTrainer


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory) -> str:
    from comlrl_lab.models.gguf import convert_gguf

    folder = tmp_path_factory.mktemp("chat")
    convert_gguf(write_tiny_gguf(folder / "tiny.gguf"), folder / "model")
    return str(folder / "model")


def test_a_prompt_becomes_one_user_message_ready_for_the_answer(chat_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    rendered = render_prompt(tokenizer, "Say something about rain.\nAnswer:")
    assert rendered == "<|im_start|>user\nSay something about rain.\nAnswer:<|im_end|>\n<|im_start|>assistant\n"
    messages = [{"role": "user", "content": "Say something about rain.\nAnswer:"}]
    template_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert tokenizer(rendered)["input_ids"] == list(template_ids)
    assert end_of_turn_ids(tokenizer) == [tokenizer.convert_tokens_to_ids(END_OF_TURN)]


def test_a_template_that_writes_the_bos_is_not_given_a_second_one():
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())  # it prepends <s> itself when encoding
    tokenizer.chat_template = (
        "<s>{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}</s>{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    rendered = render_prompt(tokenizer, "rain")
    assert rendered == "[user] rain</s>[assistant] "
    messages = [{"role": "user", "content": "rain"}]
    template_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert tokenizer(rendered)["input_ids"] == list(template_ids)
    assert tokenizer(rendered)["input_ids"].count(tokenizer.bos_token_id) == 1
    assert end_of_turn_ids(tokenizer) == [tokenizer.eos_token_id]  # this template ends a turn with the EOS


def test_the_end_of_turn_joins_the_models_eos_ids():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|eot|>"]})
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}<|eot|>{% endfor %}"
    eot = tokenizer.convert_tokens_to_ids("<|eot|>")
    stop_at_end_of_turn(model, tokenizer)
    assert model.generation_config.eos_token_id == [tokenizer.eos_token_id, eot]
    stop_at_end_of_turn(model, tokenizer)  # twice changes nothing
    assert model.generation_config.eos_token_id == [tokenizer.eos_token_id, eot]


def build_trainer(model: str, formatters, use_chat_template: str = "auto", tmp_path: Path | None = None):
    task = get_task("length_ratio")
    items = task.train_items()[:2]
    config = MADPOIterConfig(
        num_iterations=1,
        preference_num_candidates=2,
        max_new_tokens=8,
        eval_num_samples=2,
        use_chat_template=use_chat_template,
        agent_devices="cpu",
        seed=0,
        output_dir=str(tmp_path) if tmp_path else None,
    )
    return MADPOIterTrainer(
        agent_model=model,
        num_agents=2,
        train_dataset=items,
        eval_dataset=items,
        reward_func=task.reward_func,
        formatters=formatters,
        args=config,
    )


def test_pairs_and_candidates_keep_the_rendered_prompt_of_a_user_formatter(chat_model_dir, tmp_path):
    # A user task's own formatters, not the built-in ones: the template wraps whatever they return.
    formatters = [lambda item: f"Short: {item['topic']}", lambda item: f"Long: {item['topic']}"]
    trainer = build_trainer(chat_model_dir, formatters, tmp_path=tmp_path)
    assert all(isinstance(f, ChatFormatter) for f in trainer.formatters)
    end = trainer.tokenizers[0].convert_tokens_to_ids(END_OF_TURN)
    assert trainer.agents[0].generation_config.eos_token_id == end
    records = trainer.step("collect")
    for candidate in records.candidates:
        topic = trainer.train_items[candidate.item_index]["topic"]
        assert candidate.prompts == [
            f"<|im_start|>user\nShort: {topic}<|im_end|>\n<|im_start|>assistant\n",
            f"<|im_start|>user\nLong: {topic}<|im_end|>\n<|im_start|>assistant\n",
        ]
        assert end not in candidate.completion_ids[0][:-1]  # a response ends at its first end of turn, if any
    assert records.pairs and records.pairs[0].to_record()["prompts"][0].startswith("<|im_start|>user\nShort: ")


def test_false_keeps_raw_prompts_and_true_needs_a_template(chat_model_dir):
    formatters = list(get_task("length_ratio").formatters)
    trainer = build_trainer(chat_model_dir, formatters, use_chat_template="false")
    item = trainer.train_items[0]
    assert [f(item) for f in trainer.formatters] == [f(item) for f in formatters]
    with pytest.raises(ValueError, match="use_chat_template='true', but the tokenizer of 'comlrl-lab/tiny' has no"):
        build_trainer(TINY_MODEL_NAME, formatters, use_chat_template="true")


def test_auto_leaves_the_embedded_model_as_it_was():
    formatters = list(get_task("length_ratio").formatters)
    trainer = build_trainer(TINY_MODEL_NAME, formatters)
    item = trainer.train_items[0]
    assert [f(item) for f in trainer.formatters] == [f(item) for f in formatters]
    assert not any(isinstance(f, ChatFormatter) for f in trainer.formatters)
    assert trainer.agents[0].generation_config.eos_token_id == trainer.tokenizers[0].eos_token_id


def test_an_api_comparator_is_sent_the_tasks_own_prompt_and_its_pairs_keep_the_rendered_one(
    chat_model_dir, tmp_path, monkeypatch
):
    from http_stub import HttpStub, openai_chat

    monkeypatch.setenv("COMLRL_TEST_API_KEY", "test-key")
    task = get_task("length_ratio")
    with HttpStub() as stub:
        stub.route("/v1/chat/completions", openai_chat())
        config = MADPOIterConfig(
            num_iterations=1,
            preference_num_candidates=2,
            max_new_tokens=6,
            eval_num_samples=1,
            comparator_policy="api",
            comparator_api_format="openai",
            comparator_api_url=stub.url("/v1/chat/completions"),
            comparator_api_model="stub-model",
            comparator_api_key_env="COMLRL_TEST_API_KEY",
            agent_devices="cpu",
            output_dir=str(tmp_path),
            seed=0,
        )
        trainer = MADPOIterTrainer(
            agent_model=chat_model_dir,
            num_agents=2,
            train_dataset=task.train_items()[:1],
            eval_dataset=task.train_items()[:1],
            reward_func=task.reward_func,
            formatters=list(task.formatters),
            args=config,
        )
        records = trainer.step("collect")
    item = trainer.train_items[0]
    sent = sorted(r.json["messages"][-1]["content"] for r in stub.requests)
    assert sent == sorted(f(item) for f in task.formatters)  # no <|im_start|> markup goes to the endpoint
    comparator = [c for c in records.candidates if c.side == "comparator"]
    assert comparator and all(c.prompts[0].startswith("<|im_start|>user\n") for c in comparator)
