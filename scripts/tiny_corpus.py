"""Builds the embedded tiny model's training corpus: task prompts followed by short templated English answers.

Every example is one built-in task prompt (any agent, any topic/setting/stance from the task word lists, so
every train and eval prompt is covered) or an item's shared ``prompt``, then a varied answer of about 3 to
30 words. Answers are deliberately only loosely tied to their prompt: their length, whether they name the
topic and their tone vary at random, so the model's first samples spread in reward and preference learning
has something to sort. This module only builds text; ``train_tiny_lm.py`` trains on it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from comlrl_lab.data.tasks import get_task, list_word_tasks
from comlrl_lab.data.tasks.generate import shared_prompt
from comlrl_lab.data.tasks.lexicon import SETTINGS, STANCES, TOPICS, words

# fmt: off
#: The corpus's evaluative words, and what makes an answer's tone positive or negative while it is built (the
#: stance_agreement reward grades with VADER, which also rates these words; these lists only shape the corpus).
POSITIVE_WORDS: frozenset[str] = frozenset(
    {
        "good", "great", "happy", "lovely", "bright", "kind", "warm", "calm", "fun", "beautiful",
        "nice", "pleasant", "wonderful", "love", "loves", "enjoy", "enjoys", "like", "likes", "helpful",
        "fresh", "safe", "glad", "friendly", "cheerful", "sweet", "best", "clean", "peaceful", "delightful",
    }
)
NEGATIVE_WORDS: frozenset[str] = frozenset(
    {
        "bad", "awful", "sad", "boring", "ugly", "terrible", "dirty", "noisy", "angry", "hate",
        "hates", "dislike", "dislikes", "poor", "broken", "dangerous", "gloomy", "harsh", "nasty", "worst",
        "unpleasant", "scary", "lonely", "rude", "messy", "fear", "fears", "dull", "smelly", "horrible",
    }
)
NOUNS = (
    "friend", "teacher", "child", "family", "neighbor", "door", "table", "chair", "sky", "sun",
    "wind", "water", "stone", "paper", "picture", "room", "light", "morning", "evening", "sister",
    "brother", "mother", "father", "farmer", "baker", "doctor", "student", "player", "singer", "driver",
    "corner", "shop", "wall", "roof", "floor", "path", "gate", "box", "cup", "bag",
    "uncle", "aunt", "baby", "king", "queen", "captain", "sailor", "pilot", "nurse", "cook",
    "artist", "writer", "poet", "judge", "guard", "clown", "giant", "robot", "fox", "bear",
    "wolf", "rabbit", "mouse", "duck", "sheep", "cow", "fish", "frog", "owl", "bee",
    "basket", "blanket", "bottle", "candle", "coat", "hat", "shoe", "ball", "kite", "drum",
    "guitar", "piano", "map", "key", "ring", "mirror", "pillow", "spoon", "plate", "jar",
    "ladder", "rope", "tent", "wheel", "cloud", "star", "leaf", "seed", "shell", "sand",
    "ice", "fog", "pond", "tower", "fence", "barn", "cave", "nest", "coin", "feather",
) + TOPICS
NEUTRAL_ADJECTIVES = (
    "big", "small", "old", "new", "red", "blue", "green", "tall", "long", "round",
    "wooden", "early", "late", "busy", "quiet", "wide", "little", "young", "white", "dark",
    "yellow", "heavy", "short", "open", "silver", "empty", "full", "famous", "plain", "simple",
    "soft", "hard", "thin", "thick", "deep", "high", "low", "narrow", "square", "striped",
    "golden", "purple", "orange", "gray", "brown", "distant", "hidden", "strange", "rare", "tiny",
    "huge", "ancient", "modern", "wet", "dry", "hot", "cold", "loud", "slow", "fast",
)
POSITIVE_ADJECTIVES = tuple(
    sorted(POSITIVE_WORDS - {"love", "loves", "enjoy", "enjoys", "like", "likes", "best"})
)
NEGATIVE_ADJECTIVES = tuple(
    sorted(NEGATIVE_WORDS - {"hate", "hates", "dislike", "dislikes", "fear", "fears", "worst"})
)
FEELINGS = {"positive": ("love", "like", "enjoy"), "negative": ("hate", "dislike", "fear")}
INTRANSITIVE = (
    ("walks", "walk"), ("runs", "run"), ("sits", "sit"), ("waits", "wait"), ("stays", "stay"),
    ("moves", "move"), ("turns", "turn"), ("rests", "rest"), ("shines", "shine"), ("grows", "grow"),
    ("sings", "sing"), ("plays", "play"), ("stands", "stand"), ("falls", "fall"), ("goes", "go"),
    ("sleeps", "sleep"), ("jumps", "jump"), ("swims", "swim"), ("flies", "fly"), ("climbs", "climb"),
    ("waves", "wave"), ("dreams", "dream"), ("laughs", "laugh"), ("listens", "listen"), ("wanders", "wander"),
    ("hides", "hide"), ("returns", "return"), ("works", "work"), ("travels", "travel"), ("shakes", "shake"),
)
TRANSITIVE = (
    ("sees", "see"), ("visits", "visit"), ("finds", "find"), ("makes", "make"), ("watches", "watch"),
    ("paints", "paint"), ("carries", "carry"), ("shares", "share"), ("builds", "build"), ("reads", "read"),
    ("opens", "open"), ("remembers", "remember"), ("brings", "bring"), ("follows", "follow"), ("hears", "hear"),
    ("draws", "draw"), ("cooks", "cook"), ("fixes", "fix"), ("holds", "hold"), ("sells", "sell"),
    ("buys", "buy"), ("keeps", "keep"), ("counts", "count"), ("teaches", "teach"), ("pulls", "pull"),
    ("pushes", "push"), ("washes", "wash"), ("measures", "measure"), ("chooses", "choose"), ("passes", "pass"),
)
PREPOSITIONS = ("to", "near", "by", "under", "over", "across", "behind", "beside", "around", "into")
TIMES = (
    "every day", "in the evening", "at noon", "all week", "today", "on sunday", "again", "after lunch",
    "at dawn", "at dusk", "in the spring", "in the autumn", "before dinner", "every night", "once a year", "on monday",
)
ADVERBS = (
    "slowly", "quickly", "softly", "often", "always", "sometimes", "together", "outside",
    "gently", "loudly", "carefully", "silently", "later", "nearby", "away", "home",
)
REASONS = ("because", "since")
# fmt: on

TONES = ("positive", "negative", "neutral", "mixed")
_ARTICLE_BEFORE_VOWEL = re.compile(r"\ba ([aeiou])")


@dataclass(frozen=True)
class AnswerStyle:
    """How one kind of prompt is answered: a word-count range, how often the topic is named, the tones."""

    min_words: int
    max_words: int
    topic_rate: float
    tone_weights: tuple[float, float, float, float]  # positive, negative, neutral, mixed


# Agent 1 of length_ratio answers shorter than agent 2 on average, but both ranges overlap widely, so a
# ratio near 2 is neither rare nor the rule. Stance answers match the asked stance only a little more
# often than they oppose it.
#
# Besides the topic, an answer names the setting's noun ("winter" of "in winter") about as often. A lone
# favourite noun would win every draw at a low temperature (CoMLRL samples at 0.6, top_p 0.6), so every
# candidate would name the topic; two near-equal favourites keep candidates apart there too.
SETTING_RATE = 0.35
STYLES = {
    ("length_ratio", 0): AnswerStyle(3, 16, 0.5, (0.3, 0.3, 0.3, 0.1)),
    ("length_ratio", 1): AnswerStyle(3, 30, 0.5, (0.3, 0.3, 0.3, 0.1)),
    ("topic_relay", 0): AnswerStyle(3, 20, 0.4, (0.3, 0.3, 0.3, 0.1)),
    ("topic_relay", 1): AnswerStyle(3, 20, 0.4, (0.3, 0.3, 0.3, 0.1)),
    ("stance_agreement", 0): AnswerStyle(3, 20, 0.5, (0.0, 0.0, 0.0, 0.0)),
    ("stance_agreement", 1): AnswerStyle(3, 20, 0.5, (0.0, 0.0, 0.0, 0.0)),
    ("shared", 0): AnswerStyle(3, 30, 0.5, (0.3, 0.3, 0.3, 0.1)),
}
# For stance prompts the tone follows the asked stance: same, opposite, neutral, mixed.
STANCE_TONE_WEIGHTS = (0.55, 0.15, 0.2, 0.1)


# Sentence shapes. {a1}..{a3} are adjectives in the answer's tone; {n1}..{n3} nouns, any of which may be the topic.
TEMPLATES = (
    "the {n1} is {a1}.",
    "a {a1} {n1}.",
    "the {n1} {vi} {adv}.",
    "it is {a1} and {a2}.",
    "the {a1} {n1} {vi} {p} the {n2}.",
    "i {vt_base} the {a1} {n1} {t}.",
    "we {vt_base} the {n1} and the {n2}.",
    "my {n1} {vi} {p} the {a1} {n2} {t}.",
    "there is a {a1} {n1} {p} the {n2}.",
    "everyone says the {n1} is {a1}.",
    "the {n1} {vt} a {a1} {n2} {t}.",
    "the {n1} is {a1} {why} it is {a2}.",
    "the {n1} and the {n2} {vi_base} {adv}.",
    "when the {n1} {vi}, we {vt_base} the {a1} {n2}.",
    "the {a1} {n1} {vi} {p} the {a2} {n2} and the {n3} {vi2} {adv}.",
    "at last the {n1} {vi} {adv}.",
    "you can {vt_base} the {a1} {n1} {p} the {n2} {t}.",
)
# Only for answers with a positive or negative tone; {feel} is love/like/enjoy or hate/dislike/fear.
FEELING_TEMPLATES = (
    "i {feel} the {n1}.",
    "we {feel} the {a1} {n1} {t}.",
    "my {n2} {feel}s the {a1} {n1}.",
    "i {feel} it because the {n1} is {a1}.",
)


def tone_polarity(text: str) -> float:
    """(positive - negative) / (positive + negative) corpus words of ``text``, in [-1, 1]; 0.0 with none."""
    ws = words(text)
    pos = sum(w in POSITIVE_WORDS for w in ws)
    neg = sum(w in NEGATIVE_WORDS for w in ws)
    return 0.0 if pos + neg == 0 else (pos - neg) / (pos + neg)


class SentenceMaker:
    """Random simple sentences in a given tone, optionally naming a topic."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def adjective(self, tone: str) -> str:
        r = self.rng.random()
        if tone == "mixed":
            tone = self.rng.choice(("positive", "negative"))
        if tone == "positive" and r < 0.7:
            return self.rng.choice(POSITIVE_ADJECTIVES)
        if tone == "negative" and r < 0.7:
            return self.rng.choice(NEGATIVE_ADJECTIVES)
        return self.rng.choice(NEUTRAL_ADJECTIVES)

    def sentence(self, tone: str, topic: str | None = None) -> str:
        """One sentence; ``topic``, when given, fills one of the sentence's noun slots, picked at random."""
        rng = self.rng
        vi, vi_base = rng.choice(INTRANSITIVE)
        vt, vt_base = rng.choice(TRANSITIVE)
        fields = {
            "n1": rng.choice(NOUNS), "n2": rng.choice(NOUNS), "n3": rng.choice(NOUNS),
            "a1": self.adjective(tone), "a2": self.adjective(tone),
            "vi": vi, "vi_base": vi_base, "vi2": rng.choice(INTRANSITIVE)[0], "vt": vt, "vt_base": vt_base,
            "p": rng.choice(PREPOSITIONS), "t": rng.choice(TIMES), "adv": rng.choice(ADVERBS),
            "why": rng.choice(REASONS),
        }  # fmt: skip
        templates = list(TEMPLATES)
        if tone in ("positive", "negative") or (tone == "mixed" and rng.random() < 0.5):
            fields["feel"] = rng.choice(FEELINGS[tone if tone != "mixed" else rng.choice(STANCES)])
            templates += FEELING_TEMPLATES
        if topic is not None:
            # The topic is not always the opening noun: a low-temperature sampler would otherwise
            # collapse onto "The <topic> is ..." and every candidate would name it.
            slot = rng.choice(("n1", "n2"))
            templates = [x for x in templates if "{" + slot + "}" in x]
            fields[slot] = topic
        text = _ARTICLE_BEFORE_VOWEL.sub(r"an \1", rng.choice(templates).format(**fields))
        return text[0].upper() + text[1:]

    def answer(self, style: AnswerStyle, tone: str, topic: str, setting_noun: str) -> str:
        """An answer in ``tone``; a positive or negative one always holds at least one word of that tone."""
        for _ in range(20):
            text = self._sentences(style, tone, topic, setting_noun)
            p = tone_polarity(text)
            if tone in ("neutral", "mixed") or (tone == "positive" and p > 0) or (tone == "negative" and p < 0):
                return text
        return text

    def _sentences(self, style: AnswerStyle, tone: str, topic: str, setting_noun: str) -> str:
        """Sentences until the drawn word count is reached (give or take two words), some naming the item."""
        target = self.rng.randint(style.min_words, style.max_words)
        sentences: list[str] = []
        count = 0
        while count < target:
            candidates = [self.sentence(tone) for _ in range(6)]
            room = target - count
            fitting = [s for s in candidates if len(s.split()) <= room]
            if not fitting:
                if sentences and room <= 2:
                    break
                fitting = [min(candidates, key=lambda s: len(s.split()))]
            sentences.append(self.rng.choice(fitting))
            count += len(sentences[-1].split())
        named = [topic] if self.rng.random() < style.topic_rate else []
        if self.rng.random() < SETTING_RATE:
            named.append(setting_noun)
        self.rng.shuffle(named)
        for noun, i in zip(named, self.rng.sample(range(len(sentences)), len(sentences))):
            same_length = [
                c for c in (self.sentence(tone, noun) for _ in range(12)) if len(c.split()) == len(sentences[i].split())
            ]
            sentences[i] = same_length[0] if same_length else self.sentence(tone, noun)
        return " ".join(sentences)


def corpus_examples(num_examples: int, seed: int = 0) -> list[tuple[str, str]]:
    """``num_examples`` (prompt, answer) pairs, the same list for the same seed on every machine."""
    rng = random.Random(seed)
    maker = SentenceMaker(rng)
    tasks = [get_task(name) for name in list_word_tasks()]
    examples = []
    for _ in range(num_examples):
        item = {"topic": rng.choice(TOPICS), "setting": rng.choice(SETTINGS)}
        task = rng.choice(tasks + [None])
        # Stance prompts always carry a stance; a third of the shared prompts do too.
        wants_stance = task.name == "stance_agreement" if task is not None else rng.random() < 0.3
        if wants_stance:
            item["stance"] = rng.choice(STANCES)
        if task is None:
            prompt, key = shared_prompt(item), ("shared", 0)
        else:
            agent = rng.randrange(task.num_agents)
            prompt, key = task.formatters[agent](item), (task.name, agent)
        if "stance" in item:
            opposite = "negative" if item["stance"] == "positive" else "positive"
            tone = rng.choices((item["stance"], opposite, "neutral", "mixed"), STANCE_TONE_WEIGHTS)[0]
        else:
            tone = rng.choices(TONES, STYLES[key].tone_weights)[0]
        setting_noun = item["setting"].split()[-1]
        examples.append((prompt, maker.answer(STYLES[key], tone, item["topic"], setting_noun)))
    return examples


if __name__ == "__main__":
    for prompt, answer in corpus_examples(12, seed=1):
        print(repr(prompt), "->", answer)
