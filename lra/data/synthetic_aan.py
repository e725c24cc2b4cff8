"""A small synthetic stand-in for the AAN pairs files of LRA Retrieval (tests, tiny runs).

It writes ``new_aan_pairs.{train,eval,test}.tsv`` in the official format
(REFERENCE section 2; tab separated, no header, no quoting, columns
``label id1 id2 text1 text2``, label written as ``"1.0"`` / ``"0.0"``), so the
tiny task is read by the same parser as the real data. The data is NOT the
ACL Anthology Network corpus and numbers from it are not LRA scores.

Documents are made-up "papers": a title and a body of words. Each document has
a topic; a topic's words are spelled with its own letters (the alphabet is cut
into ``num_topics`` groups), mixed with words of random topics (a fraction
``off_topic`` of the content words), shared function words and a little
punctuation, including quote characters that a CSV reader would misparse and
a few non-ASCII UTF-8 characters. A label-1 pair shares its topic, a label-0
pair does not, and labels are balanced, so the task is learnable from byte
statistics by a small two-tower model. Everything depends only on the seed and
the parameters; ``fixture.json`` records them, and an existing folder written
with the same parameters is reused.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

from lra.atomic import atomic_folder
from lra.errors import ConfigError

SPLIT_FILES = {
    "train": "new_aan_pairs.train.tsv",
    "val": "new_aan_pairs.eval.tsv",
    "test": "new_aan_pairs.test.tsv",
}
FIXTURE_FILE = "fixture.json"
FUNCTION_WORDS = ("the", "of", "and", "we", "in", "a", "to", "is", "for", "this", "with", "on")
PUNCTUATION = (".", ",", ";", ":", '"', "'", "(", ")", "\\", "é", "—")


def _topic_words(rng: random.Random, letters: str, count: int) -> list[str]:
    words = set()
    while len(words) < count:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 8))))
    return sorted(words)


def _document(
    rng: random.Random,
    topics: list[list[str]],
    topic: int,
    lengths: tuple[int, int],
    off_topic: float,
) -> str:
    words = topics[topic]

    def content_word() -> str:
        if rng.random() < off_topic:
            return rng.choice(topics[rng.randrange(len(topics))])
        return rng.choice(words)

    title = " ".join(content_word().capitalize() for _ in range(rng.randint(2, 5)))
    body = []
    for _ in range(rng.randint(*lengths)):
        body.append(rng.choice(FUNCTION_WORDS) if rng.random() < 0.3 else content_word())
        if rng.random() < 0.08:
            body[-1] += rng.choice(PUNCTUATION)
    return f"{title} . {' '.join(body)} ."


def _rows(rng: random.Random, n: int, topics: list[list[str]], lengths, off_topic, start):
    labels = [i % 2 for i in range(n)]
    rng.shuffle(labels)
    rows = []
    for i, label in enumerate(labels):
        t1 = rng.randrange(len(topics))
        t2 = t1 if label else rng.choice([t for t in range(len(topics)) if t != t1])
        id1 = f"S{start + 2 * i:05d}"
        id2 = f"S{start + 2 * i + 1:05d}"
        text1 = _document(rng, topics, t1, lengths, off_topic)
        text2 = _document(rng, topics, t2, lengths, off_topic)
        rows.append(f"{float(label)}\t{id1}\t{id2}\t{text1}\t{text2}\n")
    return rows


def write_aan_fixture(
    out_dir: Path,
    *,
    num_train: int,
    num_val: int,
    num_test: int,
    seed: int = 0,
    num_topics: int = 4,
    words_per_topic: int = 24,
    min_words: int = 10,
    max_words: int = 40,
    off_topic: float = 0.25,
) -> Path:
    """Write the three synthetic AAN-format files into ``out_dir``; returns it.

    Reuses ``out_dir`` when its ``fixture.json`` records the same parameters;
    otherwise writes into a temporary sibling and renames it into place.
    """
    params = dict(
        num_train=int(num_train),
        num_val=int(num_val),
        num_test=int(num_test),
        seed=int(seed),
        num_topics=int(num_topics),
        words_per_topic=int(words_per_topic),
        min_words=int(min_words),
        max_words=int(max_words),
        off_topic=float(off_topic),
    )
    if min(num_train, num_val, num_test) < 1:
        raise ConfigError(f"the AAN fixture needs at least one row per split, got {params}")
    if not 2 <= num_topics <= 13 or not 1 <= min_words <= max_words or not 0 <= off_topic < 1:
        raise ConfigError(
            "the AAN fixture needs 2 <= num_topics <= 13, 1 <= min_words <= max_words and "
            f"0 <= off_topic < 1, got {params}"
        )
    out_dir = Path(out_dir)
    try:
        if json.loads((out_dir / FIXTURE_FILE).read_text()) == params and all(
            (out_dir / name).is_file() for name in SPLIT_FILES.values()
        ):
            return out_dir
    except (OSError, json.JSONDecodeError):
        pass

    rng = random.Random(seed)
    letters = list(string.ascii_lowercase)
    rng.shuffle(letters)
    per_topic = len(letters) // num_topics
    topics = [
        _topic_words(rng, "".join(letters[k * per_topic : (k + 1) * per_topic]), words_per_topic)
        for k in range(num_topics)
    ]
    with atomic_folder(out_dir) as tmp:
        start = 0
        for split, name in SPLIT_FILES.items():
            n = params[f"num_{split}"]
            rows = _rows(rng, n, topics, (min_words, max_words), off_topic, start)
            start += 2 * n
            (tmp / name).write_bytes("".join(rows).encode("utf-8"))
        (tmp / FIXTURE_FILE).write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
    return out_dir
