"""Deterministic test prompts (no external data)."""

SHORT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "List three colors of the rainbow:\n1.",
    "In 1969, the first humans landed on the",
]


def long_document(num_items: int = 105) -> str:
    """~2,000 tokens of varied, structured English text."""
    subjects = ["the river", "a small robot", "the old library", "our team", "the northern lights", "a quiet village"]
    verbs = ["remembered", "measured", "painted", "carried", "explained", "forgot"]
    objects = ["seven lanterns", "the blue door", "a map of the stars", "forty-two stones", "the morning bread", "an unfinished song"]
    lines = []
    for i in range(num_items):
        s = subjects[i % len(subjects)]
        v = verbs[(i * 5) % len(verbs)]
        o = objects[(i * 7) % len(objects)]
        lines.append(f"{i + 1}. On day {3 * i + 1}, {s} {v} {o}.")
    return "Here is a log of events.\n" + "\n".join(lines) + "\nSummary of the log:"
