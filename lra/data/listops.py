"""ListOps: generate the data set, write it in the official format, load it.

Source: ListOps (Nangia & Bowman, 2018, "ListOps: A Diagnostic Dataset for
Latent Tree Learning") in the long-sequence variant of Long-Range Arena
(Tay et al., 2020). The generator follows the logic of the official LRA
generator (see ``REFERENCE.md`` section 3) but is seeded, reproducible and runs
in parallel processes.

An expression is a tree: a leaf is a digit 0-9; an inner node applies one of
``[MIN``, ``[MAX``, ``[MED`` (median, truncated to an int) or ``[SM`` (sum
mod 10) to 2..``max_args`` children and is closed by ``]``. Trees are nested
as left-nested pairs and each pair is written as ``( A B )``, for example
``( ( ( [MAX 2 ) 9 ) ] )`` (value 9). The length of a tree is its number of
operator, digit and ``]`` tokens (4 in the example); parentheses do not count.

Files (the layout of ``lra_release/listops-1000``): ``basic_train.tsv``,
``basic_val.tsv``, ``basic_test.tsv``; tab separated with the header line
``Source\\tTarget``; Source is the serialized expression, Target its value 0-9.
The official set has 96,000 / 2,000 / 2,000 unique trees with
500 < length < 2000. :func:`write_listops` also writes ``metadata.json`` with
the generator parameters, seed, counts and time taken.

Loaded form (:func:`read_tsv`): a :class:`~lra.data.split.Split` with
``inputs = (uint8[N, max_length],)`` token ids padded with 0,
``lengths = (int32[N],)`` and ``labels = int32[N]``.

Vocabulary (fixed, never dependent on set order): id 0 is padding; digits
``'0'``..``'9'`` are ids 1..10; ``[MIN`` 11, ``[MAX`` 12, ``[MED`` 13,
``[SM`` 14, ``]`` 15. ``VOCAB_SIZE = 16``.

Reproducibility: trees are generated in fixed-size chunks; chunk ``k`` uses
its own ``random.Random`` seeded from ``(seed, k)``, chunks are consumed in
order and duplicates are dropped in that order, so the files depend only on
the seed and the generator parameters, not on the number of worker processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import multiprocessing
import os
import random
import shutil
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
from tqdm import tqdm

from lra.data.split import Split
from lra.data.workers import default_workers, worker_count
from lra.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

MIN = "[MIN"
MAX = "[MAX"
MED = "[MED"
SUM_MOD = "[SM"
END = "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
DIGITS = tuple(range(10))

#: Token strings in id order; id 0 is padding and has no token.
TOKENS = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9", MIN, MAX, MED, SUM_MOD, END)
VOCAB = {token: i + 1 for i, token in enumerate(TOKENS)}
PAD_ID = 0
VOCAB_SIZE = len(TOKENS) + 1
NUM_CLASSES = 10

SPLIT_FILES = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}
HEADER = "Source\tTarget"
METADATA_FILE = "metadata.json"

#: Trees generated per chunk. Part of the reproducibility contract: changing it
#: changes the data generated for a seed.
CHUNK_SIZE = 1000
#: Official probability that a node above the maximum depth is a leaf.
LEAF_PROB = 0.75

# ---------------------------------------------------------------------------
# Trees


def generate_tree(
    rng: random.Random,
    depth: int,
    max_depth: int = 10,
    max_args: int = 10,
    leaf_prob: float = LEAF_PROB,
) -> tuple[object, int]:
    """Draws one random tree; returns ``(tree, length)``.

    A node at ``depth < max_depth`` is a leaf with probability ``leaf_prob``
    (the official test is ``r > 0.25``); at ``max_depth`` it is always a leaf.
    A leaf is a digit (``int``). An inner node draws the number of children
    uniformly in ``2..max_args``, generates them at ``depth + 1``, then draws
    its operator; it is nested as ``(((op, c0), c1), ..., END)``. The random
    draws happen in the official generator's order. The root has depth 1.
    """
    r = rng.random() if depth < max_depth else 1.0
    if r > 1.0 - leaf_prob:
        return rng.choice(DIGITS), 1
    num_children = rng.randint(2, max_args)
    children = []
    length = 2
    for _ in range(num_children):
        child, child_length = generate_tree(rng, depth + 1, max_depth, max_args, leaf_prob)
        children.append(child)
        length += child_length
    op = rng.choice(OPERATORS)
    tree = (op, children[0])
    for child in children[1:]:
        tree = (tree, child)
    return (tree, END), length


def _serialize(tree, parts: list[str]) -> None:
    if isinstance(tree, tuple):
        parts.append("(")
        _serialize(tree[0], parts)
        _serialize(tree[1], parts)
        parts.append(")")
    else:
        parts.append(str(tree))


def to_string(tree) -> str:
    """The official serialization: every pair ``(A, B)`` becomes ``( A B )``."""
    parts: list[str] = []
    _serialize(tree, parts)
    return " ".join(parts)


def apply_operator(op: str, args: list[int]) -> int:
    """The value of ``op`` over ``args``.

    ``[MED`` is ``int(median)``: with an even count the two middle values are
    averaged and the result truncated (``[MED 2 5 ]`` is 3). ``[SM`` is the sum
    mod 10.
    """
    if op == MIN:
        return min(args)
    if op == MAX:
        return max(args)
    if op == MED:
        ordered = sorted(args)
        mid = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[mid]
        return int((ordered[mid - 1] + ordered[mid]) / 2)
    if op == SUM_MOD:
        return sum(args) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


def evaluate(tree) -> int:
    """The value (0-9) of a tree built by :func:`generate_tree`."""
    if not isinstance(tree, tuple):
        return tree
    spine, end = tree
    if end != END:
        raise ValueError(f"malformed ListOps tree: expected {END!r}, got {end!r}")
    args = []
    while True:
        head, child = spine
        args.append(evaluate(child))
        if isinstance(head, str):
            break
        spine = head
    args.reverse()
    return apply_operator(head, args)


# ---------------------------------------------------------------------------
# Parallel, reproducible generation


def _chunk_rng(seed: int, chunk: int) -> random.Random:
    state = np.random.SeedSequence(entropy=seed, spawn_key=(chunk,)).generate_state(4)
    return random.Random(int.from_bytes(state.tobytes(), "little"))


def _generate_chunk(
    params: tuple[int, int, int, int, int, int, int, float],
) -> list[tuple[int, str, int, int]]:
    """Generates chunk ``k``; returns ``(index in chunk, source, label, length)``
    of the trees whose length is strictly between the bounds, in generation
    order."""
    seed, chunk, chunk_size, min_length, max_length, max_depth, max_args, leaf_prob = params
    rng = _chunk_rng(seed, chunk)
    out = []
    for i in range(chunk_size):
        tree, length = generate_tree(rng, 1, max_depth, max_args, leaf_prob)
        if min_length < length < max_length:
            out.append((i, to_string(tree), evaluate(tree), length))
    return out


def _max_tree_length(max_depth: int, max_args: int) -> int:
    length = 1
    for _ in range(max_depth - 1):
        length = 2 + max_args * length
    return length


def _check_generator_params(
    min_length: int, max_length: int, max_depth: int, max_args: int, seed: int
) -> None:
    if max_depth < 1 or max_args < 2:
        raise ConfigError(
            f"ListOps needs max_depth >= 1 and max_args >= 2, got {max_depth}, {max_args}"
        )
    if min_length < 0 or max_length - min_length < 2:
        raise ConfigError(
            f"ListOps keeps trees with min_length < length < max_length; "
            f"min_length={min_length}, max_length={max_length} leaves no length"
        )
    longest = _max_tree_length(max_depth, max_args)
    if longest <= min_length:
        raise ConfigError(
            f"ListOps trees with max_depth={max_depth}, max_args={max_args} have at most "
            f"{longest} tokens, so none is longer than min_length={min_length}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"ListOps seed must be a non-negative integer, got {seed!r}")


#: Give up when this many chunks in a row yield no tree of an accepted length.
_MAX_EMPTY_CHUNKS = 500


def iter_accepted(
    *,
    min_length: int,
    max_length: int,
    max_depth: int = 10,
    max_args: int = 10,
    leaf_prob: float = LEAF_PROB,
    seed: int = 0,
    num_workers: int | None = None,
) -> Iterator[tuple[int, str, int, int]]:
    """Yields ``(attempt, source, label, length)`` for every generated tree with
    ``min_length < length < max_length``, without end, in a fixed order.

    ``attempt`` is the 0-based index of the tree among all trees drawn. The
    sequence depends on the seed and the generator parameters only; with
    ``num_workers`` > 1 chunks are generated in a pool of spawned processes.
    Duplicates are not removed. Close the iterator (or exhaust the enclosing
    ``with contextlib.closing(...)``) to stop the worker processes.
    """
    _check_generator_params(min_length, max_length, max_depth, max_args, seed)
    workers = worker_count(num_workers)

    def params(chunk: int):
        return (seed, chunk, CHUNK_SIZE, min_length, max_length, max_depth, max_args, leaf_prob)

    def check_progress(results, empty: int) -> int:
        empty = 0 if results else empty + 1
        if empty >= _MAX_EMPTY_CHUNKS:
            raise ConfigError(
                f"ListOps generation accepted no tree in {empty * CHUNK_SIZE} draws: "
                f"lengths {min_length} < length < {max_length} are (nearly) unreachable "
                f"with max_depth={max_depth}, max_args={max_args}"
            )
        return empty

    empty = 0
    chunk = 0
    if workers == 1:
        while True:
            results = _generate_chunk(params(chunk))
            empty = check_progress(results, empty)
            for i, source, label, length in results:
                yield chunk * CHUNK_SIZE + i, source, label, length
            chunk += 1
    # "spawn": the caller may have started JAX threads, which fork would copy.
    # A process pool from concurrent.futures fails loudly if a worker cannot
    # start (multiprocessing.Pool would keep replacing it).
    ctx = multiprocessing.get_context("spawn")
    executor = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    try:
        pending: deque = deque()
        submitted = 0
        while True:
            while len(pending) < 2 * workers:
                pending.append(executor.submit(_generate_chunk, params(submitted)))
                submitted += 1
            try:
                results = pending.popleft().result()
            except BrokenProcessPool as err:
                raise DataError(
                    "ListOps worker processes died; if you call write_listops from a "
                    "script, guard the call with `if __name__ == '__main__':` "
                    f"(worker processes are spawned) ({err})"
                ) from err
            empty = check_progress(results, empty)
            for i, source, label, length in results:
                yield chunk * CHUNK_SIZE + i, source, label, length
            chunk += 1
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------------
# Writing


def _is_complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in SPLIT_FILES.values())


def _write_metadata(path: Path, metadata: dict) -> None:
    path.write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")


def _say(message: str, progress: bool) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)
    else:
        logger.info(message)


def write_listops(
    out_dir: Path,
    *,
    num_train: int,
    num_val: int,
    num_test: int,
    min_length: int,
    max_length: int,
    max_depth: int = 10,
    max_args: int = 10,
    seed: int = 0,
    num_workers: int | None = None,
    progress: bool = True,
) -> Path:
    """Generates ListOps and writes ``basic_{train,val,test}.tsv`` and
    ``metadata.json`` into ``out_dir``; returns ``out_dir``.

    The first ``num_train`` unique trees go to train, the next ``num_val`` to
    val, the next ``num_test`` to test. The folder appears atomically: files
    are written to a temporary sibling folder that is renamed to ``out_dir``
    when complete and removed on any failure. If ``out_dir`` already holds the
    three files nothing is generated (a ``metadata.json`` there that records
    other parameters is an error).
    """
    out_dir = Path(out_dir)
    counts = {"train": int(num_train), "val": int(num_val), "test": int(num_test)}
    if any(n < 0 for n in counts.values()):
        raise ConfigError(f"ListOps split sizes must be >= 0, got {counts}")
    _check_generator_params(min_length, max_length, max_depth, max_args, seed)
    generator = dict(
        min_length=min_length,
        max_length=max_length,
        max_depth=max_depth,
        max_args=max_args,
        leaf_prob=LEAF_PROB,
        chunk_size=CHUNK_SIZE,
        seed=seed,
        counts=counts,
    )

    if out_dir.exists():
        if _is_complete(out_dir):
            _check_existing_metadata(out_dir, generator)
            _say(f"ListOps data already present in {out_dir}; not regenerating", progress)
            return out_dir
        if out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
        else:
            raise DataError(
                f"{out_dir} exists but does not hold {', '.join(SPLIT_FILES.values())}; "
                f"remove it or choose another folder"
            )

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = out_dir.parent / f"{out_dir.name}.tmp-{os.getpid()}"
    try:
        if tmp_dir.exists():
            shutil.rmtree(tmp_dir)
        tmp_dir.mkdir()
        start = time.perf_counter()
        stats = _generate_into(
            tmp_dir,
            counts,
            min_length=min_length,
            max_length=max_length,
            max_depth=max_depth,
            max_args=max_args,
            seed=seed,
            num_workers=num_workers,
            progress=progress,
        )
        seconds = time.perf_counter() - start
        metadata = {
            "dataset": "ListOps (Nangia & Bowman 2018), LRA long variant (Tay et al. 2020)",
            "format": "basic_{train,val,test}.tsv, header 'Source\\tTarget'",
            "generator": generator,
            "files": SPLIT_FILES,
            "seconds": round(seconds, 3),
            "num_workers": num_workers if num_workers is not None else default_workers(),
            **stats,
        }
        _write_metadata(tmp_dir / METADATA_FILE, metadata)
        try:
            os.replace(tmp_dir, out_dir)
        except OSError:
            if _is_complete(out_dir):  # another process finished first
                shutil.rmtree(tmp_dir, ignore_errors=True)
                _say(f"ListOps data appeared in {out_dir} meanwhile; using it", progress)
                return out_dir
            raise
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    rate = stats["acceptance_rate"]
    _say(
        f"ListOps written to {out_dir} in {seconds:.1f} s"
        + (f" (acceptance rate {rate:.4f})" if rate is not None else ""),
        progress,
    )
    return out_dir


def _check_existing_metadata(out_dir: Path, generator: dict) -> None:
    path = out_dir / METADATA_FILE
    if not path.is_file():
        return  # e.g. the official release, which has no metadata
    try:
        recorded = json.loads(path.read_text()).get("generator")
    except (OSError, ValueError, AttributeError) as err:
        raise DataError(f"cannot read {path}: {err}") from err
    if recorded != generator:
        raise ConfigError(
            f"{out_dir} holds ListOps generated with {recorded}, not the requested "
            f"{generator}; remove it or choose another folder"
        )


def _generate_into(
    directory: Path,
    counts: dict[str, int],
    *,
    min_length: int,
    max_length: int,
    max_depth: int,
    max_args: int,
    seed: int,
    num_workers: int | None,
    progress: bool,
) -> dict:
    total = sum(counts.values())
    seen: set[bytes] = set()
    duplicates = 0
    attempts = 0
    length_sum = 0
    order = list(SPLIT_FILES)
    files = {}
    try:
        for split in order:
            f = open(directory / SPLIT_FILES[split], "w", encoding="ascii", newline="\n")
            files[split] = f
            f.write(HEADER + "\n")
        boundaries = []
        acc = 0
        for split in order:
            acc += counts[split]
            boundaries.append((acc, split))
        written = 0
        bar = tqdm(total=total, unit="ex", desc="ListOps", disable=not progress)
        source_iter = iter_accepted(
            min_length=min_length,
            max_length=max_length,
            max_depth=max_depth,
            max_args=max_args,
            seed=seed,
            num_workers=num_workers,
        )
        with bar, contextlib.closing(source_iter) as examples:
            while written < total:
                attempt, source, label, length = next(examples)
                digest = hashlib.blake2b(source.encode("ascii"), digest_size=16).digest()
                if digest in seen:
                    duplicates += 1
                    continue
                seen.add(digest)
                split = next(name for bound, name in boundaries if written < bound)
                files[split].write(f"{source}\t{label}\n")
                length_sum += length
                written += 1
                attempts = attempt + 1
                bar.update(1)
    finally:
        for f in files.values():
            f.close()
    return {
        "trees_drawn": attempts,
        "duplicates_dropped": duplicates,
        "acceptance_rate": (written + duplicates) / attempts if attempts else None,
        "mean_length": length_sum / written if written else None,
    }


# ---------------------------------------------------------------------------
# Reading

_DELETE_PARENS = str.maketrans("", "", "()")


def tokenize(source: str) -> list[int]:
    """Token ids of a serialized expression: ``(`` and ``)`` are deleted, the
    rest is split on whitespace and each token mapped through :data:`VOCAB`.

    Raises:
        DataError: for a token outside the vocabulary.
    """
    ids = []
    for token in source.translate(_DELETE_PARENS).split():
        try:
            ids.append(VOCAB[token])
        except KeyError:
            raise DataError(f"unknown ListOps token {token!r}") from None
    return ids


# Fast byte-level tokenizer, equivalent to tokenize() on ASCII input: delete
# parentheses, replace each operator by one placeholder byte (0x80 + index;
# safe because the input is checked to be ASCII), then every token is one byte
# and tokens must be separated by whitespace.
_OP_PLACEHOLDERS = [(op.encode(), bytes([0x80 + i])) for i, op in enumerate(OPERATORS)]
_WHITESPACE = b" \t\n\r\x0b\x0c"


def _byte_table(mapping: dict[int, int], default: int) -> bytes:
    table = bytearray([default] * 256)
    for byte, value in mapping.items():
        table[byte] = value
    return bytes(table)


_TOKEN_BYTES = {ord(str(d)): VOCAB[str(d)] for d in range(10)}
_TOKEN_BYTES[ord(END)] = VOCAB[END]
for _i, _op in enumerate(OPERATORS):
    _TOKEN_BYTES[0x80 + _i] = VOCAB[_op]
_ID_TABLE = _byte_table(_TOKEN_BYTES, 0)
# Token bytes -> "x", whitespace -> " ", anything else -> "?".
_CLASS_TABLE = _byte_table(
    {**{b: ord("x") for b in _TOKEN_BYTES}, **{b: ord(" ") for b in _WHITESPACE}}, ord("?")
)


def _fast_ids(source: bytes) -> bytes | None:
    """Token ids of one source as bytes, or None if it is not well formed."""
    if not source.isascii():
        return None
    text = source.translate(None, b"()")
    for op, placeholder in _OP_PLACEHOLDERS:
        text = text.replace(op, placeholder)
    classes = text.translate(_CLASS_TABLE)
    if b"?" in classes or b"xx" in classes:
        return None
    return text.translate(_ID_TABLE, _WHITESPACE)


def read_tsv(path: Path, max_length: int) -> Split:
    """Reads an official-format ListOps file into a :class:`Split`.

    Rows longer than ``max_length`` tokens are truncated (their length is
    recorded as ``max_length``); shorter rows are padded with 0.

    Raises:
        DataError: the file is missing, lacks the ``Source\\tTarget`` header,
            or a row is malformed (the message names the file and the 1-based
            line number).
    """
    path = Path(path)
    if max_length < 1:
        raise ConfigError(f"max_length must be >= 1, got {max_length}")
    if not path.is_file():
        raise DataError(f"ListOps file not found: {path}")

    rows: list[bytes] = []
    labels: list[int] = []
    with open(path, "rb") as f:
        header = f.readline()
        if header.rstrip(b"\r\n") != HEADER.encode():
            raise DataError(
                f"{path}, line 1: expected the header {HEADER!r}, "
                f"got {header[:80].decode('ascii', 'replace')!r}"
            )
        for line_no, line in enumerate(f, start=2):
            line = line.rstrip(b"\r\n")
            fields = line.split(b"\t")
            if len(fields) != 2:
                raise DataError(
                    f"{path}, line {line_no}: expected 2 tab-separated fields "
                    f"(Source, Target), got {len(fields)}"
                )
            source, target = fields
            try:
                label = int(target)
            except ValueError:
                label = -1
            if not 0 <= label <= 9:
                raise DataError(
                    f"{path}, line {line_no}: label must be an integer 0-9, "
                    f"got {target[:20].decode('ascii', 'replace')!r}"
                )
            ids = _fast_ids(source)
            if ids is None:
                try:  # the reference tokenizer names the bad token
                    tokenize(source.decode("utf-8", "replace"))
                except DataError as err:
                    raise DataError(f"{path}, line {line_no}: {err}") from None
                raise DataError(f"{path}, line {line_no}: malformed source")  # unreachable
            if not ids:
                raise DataError(f"{path}, line {line_no}: empty source (no tokens)")
            rows.append(ids)
            labels.append(label)

    tokens = np.zeros((len(rows), max_length), dtype=np.uint8)
    lengths = np.empty(len(rows), dtype=np.int32)
    for i, ids in enumerate(rows):
        n = min(len(ids), max_length)
        tokens[i, :n] = np.frombuffer(ids, dtype=np.uint8, count=n)
        lengths[i] = n
    return Split(inputs=(tokens,), lengths=(lengths,), labels=np.asarray(labels, dtype=np.int32))


# ---------------------------------------------------------------------------
# Finding and loading


def find_listops_dir(data_dir: Path, subdir: str) -> Path | None:
    """``data_dir/subdir`` if it holds the three ``basic_*.tsv`` files, else
    ``data_dir/lra_release/subdir`` if that does (the release archive extracts
    to a nested ``lra_release/lra_release``, so either level may be given),
    else None."""
    data_dir = Path(data_dir)
    for candidate in (data_dir / subdir, data_dir / "lra_release" / subdir):
        if _is_complete(candidate):
            return candidate
    return None


def load_listops(
    data_dir: Path, subdir: str, max_length: int, prepare_command: str, splits=tuple(SPLIT_FILES)
) -> dict[str, Split]:
    """Loads the train, val and test splits found by :func:`find_listops_dir`.

    Raises:
        DataError: the files are not there; the message gives
            ``prepare_command``, the command that prepares them.
    """
    directory = find_listops_dir(data_dir, subdir)
    if directory is None:
        raise DataError(
            f"ListOps data not found under {data_dir} (looked for "
            f"{Path(data_dir) / subdir} and {Path(data_dir) / 'lra_release' / subdir} "
            f"holding {', '.join(SPLIT_FILES.values())}); prepare it with: {prepare_command}"
        )
    return {
        split: read_tsv(directory / name, max_length)
        for split, name in SPLIT_FILES.items()
        if split in splits
    }
