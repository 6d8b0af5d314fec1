"""The built-in prompt set for self-distillation, made offline and deterministically.

Three kinds, mixed 50/30/20 and shuffled with a fixed seed:

- ``chat``: instruction templates (explain, compare, list, how-to, short story, email, ...) over
  many topics;
- ``code``: code-writing and code-edit requests over functions and methods taken from the
  CPython standard library sources that ship with this interpreter (parsed with ``ast``,
  never imported);
- ``doc``: summarise / answer questions about standard-library docstrings.

The held-out split is fixed by *source*: a prompt is held out when the hash of its group (the
topic, or the stdlib object it quotes) falls in the held-out bucket, so no held-out topic or
snippet ever appears in a training prompt, whatever ``num_prompts`` is.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_PERCENT = 5
KIND_SHARES = (("chat", 0.5), ("code", 0.3), ("doc", 0.2))
PROMPT_KINDS = tuple(kind for kind, _ in KIND_SHARES)
MIN_SNIPPET_CHARS, MAX_SNIPPET_CHARS = 160, 1200
MIN_DOC_CHARS, MAX_DOC_CHARS = 200, 1400

TOPICS = (
    "photosynthesis", "black holes", "the French Revolution", "machine learning", "climate change",
    "the stock market", "vaccines", "the Roman Empire", "quantum computing", "plate tectonics",
    "the water cycle", "inflation", "renewable energy", "the human immune system", "blockchain",
    "the Renaissance", "volcanoes", "sleep", "meditation", "electric cars", "the internet",
    "honeybees", "coral reefs", "the Moon landing", "ancient Egypt", "supply and demand",
    "recycling", "the printing press", "DNA", "earthquakes", "social media", "coffee",
    "the Industrial Revolution", "rainforests", "compound interest", "public speaking",
    "time management", "learning a new language", "gardening", "bread baking", "chess",
    "marathon training", "the solar system", "artificial intelligence ethics", "cybersecurity",
    "password managers", "cloud computing", "databases", "operating systems", "compilers",
    "version control with git", "unit testing", "recursion", "sorting algorithms", "hash tables",
    "the theory of evolution", "antibiotics", "the human heart", "nutrition", "hydration",
    "urban planning", "public transport", "democracy", "the United Nations", "world war one",
    "the Silk Road", "the Great Wall of China", "impressionist painting", "jazz music",
    "the history of cinema", "Shakespeare", "poetry", "minimalism", "budgeting", "saving for retirement",
    "starting a small business", "remote work", "job interviews", "writing a resume", "teamwork",
    "leadership", "negotiation", "customer service", "marketing", "the scientific method",
    "statistics", "probability", "prime numbers", "the Pythagorean theorem", "calculus",
    "the speed of light", "gravity", "magnetism", "batteries", "solar panels", "wind turbines",
    "nuclear power", "ocean tides", "weather forecasting", "hurricanes", "deserts", "glaciers",
    "the Amazon river", "mountains", "penguins", "dolphins", "elephants", "dogs as pets", "cats",
    "birdwatching", "camping", "hiking safety", "travel on a budget", "packing for a trip",
    "cooking pasta", "making soup", "healthy breakfasts", "food waste", "composting",
    "3D printing", "robots", "self-driving cars", "drones", "smartphones", "video games",
    "virtual reality", "open source software", "the Linux kernel", "web browsers", "HTML and CSS",
    "REST APIs", "encryption", "data privacy", "spreadsheets", "note taking", "reading habits",
    "libraries", "museums", "volunteering", "friendship", "parenting", "exercise for beginners",
    "yoga", "stress", "mindfulness at work", "the Olympic Games", "football", "tennis",
)

# Added for the second data round (2026-12-01), so chat distillation has prompts left to answer.
# A separate tuple: ``{other}`` is picked within a topic's own tuple, so the first round's
# prompt texts (and the keys of their cached answers) stay what they were.
MORE_TOPICS = (
    "the history of money", "credit scores", "renting versus buying a home", "car maintenance",
    "bicycle commuting", "home insulation", "heat pumps", "water purification", "desalination",
    "the ozone layer", "air pollution", "noise pollution", "light pollution", "biodiversity",
    "endangered species", "national parks", "wildfires", "floods", "tsunamis", "avalanches",
    "the Arctic", "Antarctica", "the Sahara", "the Himalayas", "the Mediterranean diet",
    "vitamins", "sugar", "caffeine", "vegetarian cooking", "fermentation", "cheese making",
    "tea", "chocolate", "spices", "street food", "table manners", "wedding planning",
    "birthday parties", "moving to a new city", "learning to drive", "learning to swim",
    "playing the guitar", "learning the piano", "singing", "dancing", "photography",
    "drawing for beginners", "watercolor painting", "knitting", "woodworking", "pottery",
    "origami", "board games", "puzzles", "crossword puzzles", "magic tricks", "stand-up comedy",
    "theater", "opera", "classical music", "rock music", "hip hop", "podcasts", "radio",
    "newspapers", "journalism", "fake news", "advertising", "branding", "e-commerce",
    "online shopping safety", "customer reviews", "small talk", "active listening",
    "giving feedback", "conflict resolution", "making decisions", "setting goals",
    "building habits", "procrastination", "motivation", "curiosity", "creativity",
    "critical thinking", "logical fallacies", "philosophy", "ethics", "Stoicism",
    "the Greek myths", "Norse mythology", "the Vikings", "the Aztecs", "the Maya",
    "the Ottoman Empire", "the Cold War", "the space race", "the Mars rovers",
    "the International Space Station", "telescopes", "comets", "exoplanets", "the Big Bang",
    "dark matter", "atoms", "the periodic table", "chemical reactions", "acids and bases",
    "electricity", "circuits", "semiconductors", "transistors", "microprocessors",
    "computer memory", "hard drives", "keyboards", "touch screens", "wifi", "Bluetooth",
    "GPS", "satellites", "5G networks", "email", "spam filters", "search engines",
    "recommendation systems", "neural networks", "large language models", "chatbots",
    "computer vision", "speech recognition", "machine translation", "data science",
    "data visualization", "SQL", "Python programming", "JavaScript", "functional programming",
    "object-oriented programming", "design patterns", "code reviews", "debugging",
    "technical debt", "agile development", "project management", "documentation",
    "APIs", "microservices", "containers", "continuous integration", "backups",
    "two-factor authentication", "phishing", "malware", "firewalls", "online privacy for kids",
    "screen time", "digital detox", "handwriting", "speed reading", "memory techniques",
    "studying for exams", "homeschooling", "online courses", "scholarships", "student loans",
    "choosing a career", "internships", "mentorship", "networking", "public libraries",
    "city parks", "bridges", "skyscrapers", "tunnels", "railways", "airports", "ships",
    "submarines", "hot air balloons", "the Wright brothers", "the telephone", "the light bulb",
)

CHAT_TEMPLATES = (
    "Explain {topic} to a beginner.",
    "Explain {topic} in simple terms, as if to a ten-year-old.",
    "What are the main advantages and disadvantages of {topic}?",
    "List five interesting facts about {topic}.",
    "Give me three tips related to {topic}.",
    "How do I get started with {topic}?",
    "Write a short story that involves {topic}.",
    "Write a short poem about {topic}.",
    "Write a polite email to a colleague proposing a lunch talk about {topic}.",
    "Write a short blog post introduction about {topic}.",
    "Summarize the most important ideas about {topic} in one paragraph.",
    "What are common misconceptions about {topic}?",
    "Why is {topic} important?",
    "Describe the history of {topic} briefly.",
    "Create a quiz with three questions about {topic}, with answers.",
    "What questions should I ask an expert on {topic}?",
    "Give a step-by-step guide related to {topic}.",
    "Write a tweet about {topic}.",
    "What would a good first lesson on {topic} cover?",
    "Write a dialogue between a teacher and a student about {topic}.",
    "How has {topic} changed in the last fifty years?",
    "What is the future of {topic}?",
    "Compare {topic} and {other}.",
    "What do {topic} and {other} have in common?",
    "Write a short story that connects {topic} and {other}.",
    "What is the difference between {topic} and {other}?",
    "Give me a simple analogy that explains {topic}.",
    "What are the biggest challenges in {topic} today?",
    "Write a haiku about {topic}.",
    "Write a short speech about {topic} for a school assembly.",
    "What are some good books or resources to learn about {topic}?",
    "Explain {topic} in exactly three sentences.",
    "What mistakes do beginners make with {topic}?",
    "Write a product description for an app that teaches {topic}.",
    "Write a limerick about {topic}.",
    "Give me a fun fact about {topic} and explain why it is true.",
    "How would you explain {topic} to someone from the year 1800?",
    "Write a short news report about a discovery related to {topic}.",
    "What careers are related to {topic}?",
    "Make a checklist for someone interested in {topic}.",
)

CODE_EDIT_TEMPLATES = (
    "Explain what this Python function does:\n\n```python\n{code}\n```",
    "Add type hints to this Python code:\n\n```python\n{code}\n```",
    "Write a docstring for this function:\n\n```python\n{code}\n```",
    "Rewrite this Python code to be more readable:\n\n```python\n{code}\n```",
    "Find possible bugs or edge cases in this code:\n\n```python\n{code}\n```",
    "Write unit tests with pytest for this function:\n\n```python\n{code}\n```",
    "Rename the variables in this code to clearer names:\n\n```python\n{code}\n```",
    "Add comments to this code:\n\n```python\n{code}\n```",
    "Convert this Python function to JavaScript:\n\n```python\n{code}\n```",
)

CODE_WRITE_TEMPLATES = (
    "Write a Python function `{name}` that does the following: {summary}",
    "Implement `{name}` in Python. Specification: {summary}",
    "Show me how to write a Python function that does this: {summary}",
)

DOC_TEMPLATES = (
    "Summarize the following documentation in three bullet points:\n\n{doc}",
    "Summarize this text in one sentence:\n\n{doc}",
    "Read this documentation and explain it in plain English:\n\n{doc}",
    "{doc}\n\nWhat is the main purpose of the `{name}` described above?",
    "{doc}\n\nBased on the text above, give an example of when to use `{name}`.",
    "Here is the documentation of `{name}`:\n\n{doc}\n\nWhat are its most important parameters or features?",
)


@dataclass(frozen=True)
class Prompt:
    key: str  # stable id: hash of the text
    kind: str  # chat | code | doc
    group: str  # the topic or stdlib object it is about (the split unit)
    text: str

    @property
    def split(self) -> str:
        return "heldout" if is_held_out(self.group) else "train"


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "big")


def is_held_out(group: str) -> bool:
    return _digest("split:" + group) % 100 < HELD_OUT_PERCENT


def _prompt(kind: str, group: str, text: str) -> Prompt:
    return Prompt(key=f"{kind}-{_digest(text):016x}", kind=kind, group=group, text=text)


def stdlib_dir() -> Path:
    return Path(os.path.dirname(os.__file__))


@functools.lru_cache(maxsize=1)
def _stdlib_objects() -> list[tuple[str, ast.AST, list[str]]]:
    """``(qualified name, node, module source lines)`` for top-level functions, classes and
    methods of the stdlib's top-level ``.py`` modules, in a fixed order (parsed once)."""
    found = []
    for path in sorted(stdlib_dir().glob("*.py")):
        if path.name.startswith(("_", "test")) or path.name == "this.py":
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = path.stem
        source = source.split("\n")
        found.append((module, tree, source))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found.append((f"{module}.{node.name}", node, source))
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                        found.append((f"{module}.{node.name}.{item.name}", item, source))
    return found


def _summary(doc: str) -> str:
    first = doc.strip().split("\n\n")[0]
    return " ".join(first.split())


def chat_prompts() -> list[Prompt]:
    out = []
    for topics in (TOPICS, MORE_TOPICS):
        for i, topic in enumerate(topics):
            other = topics[(i * 7 + 3) % len(topics)]
            for template in CHAT_TEMPLATES:
                out.append(_prompt("chat", topic, template.format(topic=topic, other=other)))
    return out


def code_and_doc_prompts(rng: random.Random) -> tuple[list[Prompt], list[Prompt]]:
    code, docs = [], []
    for name, node, source in _stdlib_objects():
        short = name.rsplit(".", 1)[-1]
        doc = ast.get_docstring(node, clean=True) or ""
        if isinstance(node, ast.FunctionDef) and not short.startswith("_"):
            lines = source[node.lineno - 1 : node.end_lineno]
            snippet = "\n".join(line[node.col_offset:] if not line[: node.col_offset].strip() else line for line in lines)
            if MIN_SNIPPET_CHARS <= len(snippet) <= MAX_SNIPPET_CHARS:
                code.append(_prompt("code", name, rng.choice(CODE_EDIT_TEMPLATES).format(code=snippet)))
            summary = _summary(doc)
            if 30 <= len(summary) <= 300:
                code.append(_prompt("code", name, rng.choice(CODE_WRITE_TEMPLATES).format(name=short, summary=summary)))
        if MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS:
            docs.append(_prompt("doc", name, rng.choice(DOC_TEMPLATES).format(doc=doc, name=short)))
    return code, docs


def build_prompts(num_prompts: int | None = None, seed: int = 0) -> list[Prompt]:
    """The prompt set, deterministic for a given interpreter; ``num_prompts`` takes a prefix of
    the fixed shuffled order (kinds interleaved 50/30/20), so a larger set extends a smaller one."""
    rng = random.Random(seed)
    pools = {"chat": chat_prompts()}
    pools["code"], pools["doc"] = code_and_doc_prompts(rng)
    for pool in pools.values():
        rng.shuffle(pool)
    ordered: list[Prompt] = []
    taken = {kind: 0 for kind in pools}
    seen: set[str] = set()
    while any(taken[k] < len(pools[k]) for k in pools):
        # pick the kind furthest below its share so far (deterministic interleave)
        total = len(ordered) + 1
        open_kinds = [(share * total - taken[k], k) for k, share in KIND_SHARES if taken[k] < len(pools[k])]
        kind = max(open_kinds)[1]
        prompt = pools[kind][taken[kind]]
        taken[kind] += 1
        if prompt.key not in seen:
            seen.add(prompt.key)
            ordered.append(prompt)
        if num_prompts is not None and len(ordered) >= num_prompts:
            break
    return ordered


def text_file_chunks(paths: list[str | Path], encode, chunk_tokens: int = 512) -> list[tuple[str, list[int]]]:
    """User text files as extra training sequences: ``(key, token ids)`` chunks of at most
    ``chunk_tokens`` tokens (no generation; the text itself is the label)."""
    out = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"--text-files: {path} is not a file")
        ids = encode(path.read_text(encoding="utf-8", errors="replace"))
        for i, start in enumerate(range(0, len(ids), chunk_tokens)):
            chunk = ids[start : start + chunk_tokens]
            if len(chunk) >= 16:
                out.append((f"text-{_digest(str(path.resolve())):016x}-{i}", chunk))
    return out
