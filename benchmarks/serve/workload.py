"""Prompt sets and arrival schedules for the serving benchmark (built in: no downloads)."""

from __future__ import annotations

import random

SHORT_CHAT = [
    "What is the capital of France?", "Give me three tips for better sleep.", "Explain photosynthesis briefly.",
    "Write a haiku about the sea.", "What is a prime number?", "How do I boil an egg?",
    "Name three planets of the solar system.", "Why is the sky blue?", "Suggest a name for a cat.",
    "What does a compiler do?", "Summarize the plot of Cinderella.", "How many legs does a spider have?",
    "What is the boiling point of water?", "Give an example of a metaphor.", "What is machine learning?",
    "Translate 'good morning' into Spanish.", "What causes rain?", "List three primary colours.",
    "What is the largest ocean?", "How do bees make honey?", "Describe a rainbow in one sentence.",
    "What is gravity?", "Recommend a book for a long trip.", "What is the speed of light?",
]

_SENTENCES = [
    "The committee met on Tuesday to review the quarterly budget and the hiring plan.",
    "Rainfall in the northern valley was twice the ten-year average during the spring.",
    "The new bridge reduced the commute between the two towns from forty minutes to ten.",
    "Researchers reported that the enzyme remained stable at temperatures above ninety degrees.",
    "The library extended its opening hours after a survey of students and staff.",
    "Sales of the compact model rose steadily while the larger model declined.",
    "The orchestra rehearsed the final movement three times before the evening concert.",
    "A software update fixed the synchronisation fault reported by several customers.",
]


def long_document(num_words: int, seed: int) -> str:
    rng = random.Random(seed)
    words: list[str] = []
    while len(words) < num_words:
        words.extend(rng.choice(_SENTENCES).split())
    return " ".join(words[:num_words])


def build_prompts(dataset: str, num_prompts: int, doc_words: int = 1200, seed: int = 0) -> list[list[dict]]:
    """``num_prompts`` chat message lists: ``short_chat`` questions, or ``long_doc`` documents
    (~1.3 tokens per word) followed by a question about them."""
    prompts = []
    for i in range(num_prompts):
        if dataset == "short_chat":
            content = SHORT_CHAT[i % len(SHORT_CHAT)]
        elif dataset == "long_doc":
            content = long_document(doc_words, seed + i) + "\n\nSummarize the document above in one sentence."
        else:
            raise ValueError(f"unknown dataset {dataset!r} (short_chat, long_doc)")
        prompts.append([{"role": "user", "content": content}])
    return prompts


def arrival_offsets_s(num_requests: int, request_rate: float, arrival: str = "poisson", seed: int = 0) -> list[float]:
    """Send times from the start: all at 0 for an infinite rate, else Poisson (exponential gaps)
    or fixed-rate gaps of ``1 / request_rate``."""
    if request_rate == float("inf"):
        return [0.0] * num_requests
    rng = random.Random(seed)
    t, offsets = 0.0, []
    for _ in range(num_requests):
        offsets.append(t)
        t += rng.expovariate(request_rate) if arrival == "poisson" else 1.0 / request_rate
    return offsets
