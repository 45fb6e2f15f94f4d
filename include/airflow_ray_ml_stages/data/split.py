"""The deterministic split: each row's split is a seeded hash of its used values.

The hash is pandas' ``hash_pandas_object`` computed with numpy alone, so the same input and seed
give the same split membership whatever the engine, the batching, the number of CPUs, the order
of the files or their format. The seed keys the SipHash of text values, which leaves numeric
values unseeded; so for any seed but 0 a seed-derived constant is mixed into each row's hash too
(:func:`reseed`), and every seed splits every table differently. Seed 0 is pandas' hash unchanged,
which keeps the splits of seed-0 runs where they always were.

Identical rows are placed one by one, as distinct rows are: each repeat of a row within a batch
(the engines' batches are the same runs of rows of a file) gets a hash of its own, derived from the
row's hash and how many copies of it came before (:func:`separate_copies`); the first keeps the
row's hash. Placing the copies together would group them by label too, since the label is one of
the hashed values: a profile seen with both labels would train on one and be tested on the other.

Regression cuts each row's hash, read as a uniform number in [0, 1), at the split fractions
(:func:`split_of_hashes`). Classification stratifies: pass 1 counts each class's rows per hash bin
(:func:`bins_of_hashes`, ``STRATA_BINS`` bins), :func:`stratified_cuts` places each class's cut
points at its fractions, and a row's split compares its bin with its class's cuts
(:func:`split_of_bins`). Both depend only on the rows' content and the seed.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from airflow_ray_ml_stages.data.deferred_pandas import import_pandas


SPLITS = ("train", "validation", "test")
SPLIT_COLUMN = "split"
# Hash bins per class for the stratified split: a class's cut points fall between bins, so a class
# of n rows meets its fractions to within about n / STRATA_BINS rows (exactly, below ~100 rows).
STRATA_BINS = 1024


def hash_key(seed: int) -> str:
    """The 16-character SipHash key of a split seed."""
    return hashlib.sha256(f"rayml-split-{seed}".encode()).hexdigest()[:16]


def seed_constant(seed: int) -> int:
    """The 64-bit constant :func:`reseed` mixes into the row hashes of a split seed other than 0."""
    return int.from_bytes(hashlib.sha256(f"rayml-split-rows-{seed}".encode()).digest()[:8], "little")


def _uniform(hashed: np.ndarray) -> np.ndarray:
    """Each 64-bit row hash as a uniform number in [0, 1) (its top 53 bits)."""
    return (hashed >> np.uint64(11)).astype("float64") * 2.0**-53


def split_of_hashes(hashed: np.ndarray, fractions: list[float]) -> np.ndarray:
    """Split index (0 train, 1 validation, 2 test) of each 64-bit row hash, for the split fractions."""
    bounds = np.cumsum(fractions)[:2]
    return np.searchsorted(bounds, _uniform(hashed), side="right").astype("int8")


def bins_of_hashes(hashed: np.ndarray) -> np.ndarray:
    """Each row hash's bin among ``STRATA_BINS`` equal bins of [0, 1) (int16)."""
    return (_uniform(hashed) * STRATA_BINS).astype("int16")


def stratified_cuts(histogram: np.ndarray, fractions: list[float]) -> tuple[int, int]:
    """One class's cut points ``(train_end, validation_end)``: bin indexes, from its rows per bin.

    A row in a bin below ``train_end`` is a training row, below ``validation_end`` a validation
    row, else a test row. The cuts are the bin edges whose row counts come closest to the
    fractions (rounded half up), and a class with any row has at least one training row, so a
    class of one row trains and a class of two trains and validates (with a validation fraction).
    """
    edges = np.concatenate([[0], np.cumsum(histogram)])  # rows below each bin edge
    rows = int(edges[-1])
    if rows == 0:
        return 0, 0
    train_target = max(1, int(np.floor(fractions[0] * rows + 0.5)))
    validation_target = max(train_target, int(np.floor((fractions[0] + fractions[1]) * rows + 0.5)))
    distance = np.abs(edges - train_target).astype("float64")
    distance[edges < 1] = np.inf  # never cut before the class's first row
    train_end = int(np.argmin(distance))
    later = np.abs(edges[train_end:] - validation_target)
    return train_end, train_end + int(np.argmin(later))


def split_of_bins(bins: np.ndarray, train_end: np.ndarray, validation_end: np.ndarray) -> np.ndarray:
    """Split index of each row from its hash bin and its class's cut points (per row)."""
    return ((bins >= train_end).astype("int8") + (bins >= validation_end).astype("int8")).astype("int8")


# The row hash is pandas' ``hash_pandas_object(frame, index=False)`` (the split of a row must never
# change), computed with numpy alone so the direct engine's job does not import pandas (~0.35 s).
# A test checks it against pandas bit for bit.
_MASK64 = 0xFFFFFFFFFFFFFFFF
_NAN_BITS = np.array(np.nan, dtype="float64").view("uint64")
_NEGATIVE_ZERO_BITS = np.array(-0.0, dtype="float64").view("uint64")


def _rotate(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (64 - bits))) & _MASK64


def siphash24(key: bytes, data: bytes) -> int:
    """SipHash-2-4 of ``data`` under a 16-byte key (what pandas hashes strings with)."""
    k0, k1 = struct.unpack("<QQ", key)
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def rounds(count: int) -> None:
        for _ in range(count):
            v[0] = (v[0] + v[1]) & _MASK64
            v[1] = _rotate(v[1], 13) ^ v[0]
            v[0] = _rotate(v[0], 32)
            v[2] = (v[2] + v[3]) & _MASK64
            v[3] = _rotate(v[3], 16) ^ v[2]
            v[0] = (v[0] + v[3]) & _MASK64
            v[3] = _rotate(v[3], 21) ^ v[0]
            v[2] = (v[2] + v[1]) & _MASK64
            v[1] = _rotate(v[1], 17) ^ v[2]
            v[2] = _rotate(v[2], 32)

    whole = len(data) // 8 * 8
    for start in range(0, whole, 8):
        word = int.from_bytes(data[start:start + 8], "little")
        v[3] ^= word
        rounds(2)
        v[0] ^= word
    last = ((len(data) & 0xFF) << 56) | int.from_bytes(data[whole:], "little")
    v[3] ^= last
    rounds(2)
    v[0] ^= last
    v[2] ^= 0xFF
    rounds(4)
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def _spread(values: np.ndarray) -> np.ndarray:
    """pandas' final mixing of 64-bit hashes (in place)."""
    values ^= values >> np.uint64(30)
    values *= np.uint64(0xBF58476D1CE4E5B9)
    values ^= values >> np.uint64(27)
    values *= np.uint64(0x94D049BB133111EB)
    values ^= values >> np.uint64(31)
    return values


def _hash_floats(values: np.ndarray) -> np.ndarray:
    """``pd.util.hash_array`` of a float64 array (NaNs and -0.0 canonicalised first)."""
    bits = values.view("uint64").copy()
    bits[np.isnan(values)] = _NAN_BITS
    bits[bits == _NEGATIVE_ZERO_BITS] = 0
    return _spread(bits)


def _hash_category_codes(codes: np.ndarray, values: list, key: str) -> np.ndarray:
    """``pd.util.hash_array`` of a Categorical with these codes (-1: missing) and string categories."""
    hashed = _spread(np.array([siphash24(key.encode("utf8"), str(value).encode("utf8")) for value in values],
                              dtype="uint64"))
    result = hashed.take(codes) if len(hashed) else np.zeros(len(codes), dtype="uint64")
    result[codes < 0] = np.uint64(_MASK64)
    return result


def reseed(hashed: np.ndarray, seed: int) -> np.ndarray:
    """Row hashes made to depend on the seed whatever the column types (in place): seed 0 unchanged.

    The seed's constant is XORed in and the result re-spread: a bijection of the 64-bit hashes, so
    rows that hashed apart still do, and each seed gives an unrelated uniform number per row.
    """
    if seed == 0:  # pandas' hash as it is: seed-0 splits of rows without copies never move
        return hashed
    hashed ^= np.uint64(seed_constant(seed))
    return _spread(hashed)


COPY_CONSTANT = 0x9E3779B97F4A7C15
"""Multiplied by a repeat's rank (1, 2, ...) and mixed into its row hash (:func:`separate_copies`)."""


def separate_copies(hashed: np.ndarray) -> np.ndarray:
    """Row hashes with every repeat of an earlier row's hash hashed anew (in place).

    The k-th repeat (k = 1, 2, ...) of a hash, in row order, becomes the hash mixed with
    ``k * COPY_CONSTANT`` and re-spread; the first occurrence, and so every row without a copy, keeps
    its hash. Copies are interchangeable, so which copy is the k-th does not matter: the rows each
    split receives are the same whatever the order of the rows.
    """
    count = len(hashed)
    ordered = np.sort(hashed)  # a table without copies, the common case, costs this one sort (~1 ms a batch)
    repeats = ordered[1:] == ordered[:-1]
    if not repeats.any():
        return hashed
    order = np.argsort(hashed, kind="stable")  # ties in row order: the first occurrence is rank 0
    starts = np.flatnonzero(np.concatenate([[True], ~repeats]))  # hashed[order] is ``ordered``
    rank = np.empty(count, dtype="uint64")
    rank[order] = np.arange(count) - np.repeat(starts, np.diff(np.append(starts, count)))
    copies = np.flatnonzero(rank)
    hashed[copies] = _spread(hashed[copies] ^ (rank[copies] * np.uint64(COPY_CONSTANT)))
    return hashed


def hash_columns(columns: list, seed: int) -> np.ndarray:
    """Each row's split hash: ``pd.util.hash_pandas_object(pd.DataFrame(columns), index=False,
    hash_key=hash_key(seed))`` without pandas, then :func:`reseed` for a seed other than 0.

    Each column is a float64 array or a ``(codes, values)`` pair of a categorical column; each is
    hashed as ``pd.util.hash_array`` does and the hashes are combined as pandas does
    (``pandas.core.util.hashing.combine_hash_arrays``), so for seed 0 the two give identical values.
    """
    key = hash_key(seed)
    rows = len(columns[0][0]) if isinstance(columns[0], tuple) else len(columns[0])
    out = np.zeros(rows, dtype="uint64") + np.uint64(0x345678)
    mult = np.uint64(1000003)
    for index, column in enumerate(columns):
        inverse = len(columns) - index
        out ^= _hash_category_codes(*column, key) if isinstance(column, tuple) else _hash_floats(column)
        out *= mult
        mult += np.uint64(82520 + inverse + inverse)
    out += np.uint64(97531)
    return reseed(out, seed)


def _categorical(values: np.ndarray) -> tuple[np.ndarray, list]:
    """An object column as codes into its distinct values (-1: missing): each value hashed once."""
    pd = import_pandas()

    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    return codes, list(uniques)


def assign_splits(frame: pd.DataFrame, columns: list[str], fractions: list[float], seed: int) -> np.ndarray:
    """Split index (0 train, 1 validation, 2 test) of each row, from a seeded hash of its values (the
    frame one batch: each copy of a row placed by itself, :func:`separate_copies`)."""
    pd = import_pandas()

    if frame.empty:
        return np.zeros(0, dtype="int8")
    # Canonical types first: a value hashes the same whether it came from CSV, Parquet or pandas.
    canonical = [frame[column].to_numpy(dtype="float64") if pd.api.types.is_numeric_dtype(frame[column])
                 else _categorical(frame[column].to_numpy(dtype=object)) for column in columns]
    return split_of_hashes(separate_copies(hash_columns(canonical, seed)), fractions)
