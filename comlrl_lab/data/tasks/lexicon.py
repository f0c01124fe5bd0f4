"""Word lists and text helpers shared by the built-in tasks, their item generator and the tiny corpus.

The item lists (topics, settings, stances) are small on purpose: items stay readable, and the embedded tiny model
was trained on prompts built from them. Sentiment is not a list of ours: ``polarity`` is VADER's compound score
(the ``vaderSentiment`` package, MIT: a 7,500-entry lexicon rated by people, with rules for negation, degree words,
"but", capitals and punctuation), so "not clean" reads as negative in any English a model writes. This module
does not score anything itself; each task module turns these helpers into its reward.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

# fmt: off
#: Nouns a task item can be about. Single lower-case words, so "mentions the topic" is a word match.
TOPICS: tuple[str, ...] = (
    "rain", "river", "garden", "music", "school", "forest", "city", "ocean", "bread", "winter",
    "summer", "train", "market", "library", "mountain", "island", "bridge", "kitchen", "festival", "snow",
    "coffee", "bicycle", "museum", "harbor", "village", "desert", "lake", "farm", "castle", "park",
    "storm", "moon", "road", "beach", "cake", "tea", "dog", "cat", "horse", "bird",
    "book", "game", "film", "song", "dance", "painting", "letter", "clock", "lamp", "window",
    "house", "boat", "ship", "plane", "car", "bus", "street", "hill", "valley", "field",
    "flower", "tree", "apple", "soup", "cheese", "office", "hospital", "station", "theater", "camp",
)

#: Phrases that vary an item without changing its topic word.
SETTINGS: tuple[str, ...] = (
    "in the morning", "at night", "in winter", "in summer", "in the rain", "on a holiday",
    "for a child", "for a friend", "in a small town", "in a big city", "after school", "on the weekend",
)

STANCES: tuple[str, ...] = ("positive", "negative")

#: Function words that do not count as "content" when comparing two answers.
STOPWORDS: frozenset[str] = frozenset(
    {
        "a", "an", "the", "and", "or", "but", "is", "are", "was", "were", "be", "it", "its", "this", "that",
        "to", "of", "in", "on", "at", "for", "with", "by", "from", "as", "i", "we", "you", "they", "he",
        "she", "my", "our", "your", "their", "so", "very", "too", "not", "no", "do", "does", "there", "here",
        "all", "some", "one", "because", "when", "then", "into", "over", "under", "near", "about",
    }
)
# fmt: on

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    """Lower-case alphabetic words of ``text``, punctuation and digits dropped."""
    return _WORD.findall(text.lower())


def word_count(text: str) -> int:
    """Whitespace-separated words, as in the classic length-ratio task (punctuation stays attached)."""
    return len(text.split())


def mentions(text: str, topic: str) -> bool:
    """Whether ``topic`` (or its plural with "s"/"es", or either's possessive) is one of the words of ``text``."""
    topic = topic.lower()
    forms = {topic, topic + "s", topic + "es"}
    return any(w.removesuffix("'s") in forms for w in words(text))


@cache
def _sentiment() -> Any:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


#: VADER's own cut-off: a compound score within this distance of 0 is neutral.
NEUTRAL_BAND = 0.05


def polarity(text: str) -> float:
    """VADER's compound sentiment score of ``text``, in [-1, 1]: the sum of its words' valences after VADER's rules,
    normalised as x / sqrt(x^2 + 15). 0.0 for text with no sentiment word."""
    return float(_sentiment().polarity_scores(text)["compound"])
