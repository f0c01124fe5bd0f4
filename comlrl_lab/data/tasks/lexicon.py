"""Word lists and word-level text helpers shared by the built-in tasks, their item generator and the tiny corpus.

The lists are small on purpose: rewards stay readable and checkable by hand, and the embedded tiny model
(trained on text built from the same lists) uses the words the rewards look for. This module does not
score anything itself; each task module turns these helpers into its reward.
"""

from __future__ import annotations

import re

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

#: Evaluative words. A word in neither list is neutral.
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
    """Whether ``topic`` (or its plural with "s"/"es") is one of the words of ``text``."""
    topic = topic.lower()
    forms = {topic, topic + "s", topic + "es"}
    return any(w in forms for w in words(text))


def polarity(text: str) -> float:
    """(positive - negative) / (positive + negative) lexicon words, in [-1, 1]; 0.0 with none of either."""
    ws = words(text)
    pos = sum(w in POSITIVE_WORDS for w in ws)
    neg = sum(w in NEGATIVE_WORDS for w in ws)
    return 0.0 if pos + neg == 0 else (pos - neg) / (pos + neg)
