"""The fitted preprocessor: scaling, boolean 0/1 and one-hot encoding, saved as JSON, applied with plain numpy.

The ``data`` stage fits it on the training split only (from :class:`Moments` merged across Ray
Data batches) and writes it as JSON: column lists, categories and statistics, nothing executable,
so loading it needs no pickle. :meth:`Preprocessor.transform_arrays` is the one code path that
turns a batch into model inputs: the stage calls it on numpy arrays when it writes the splits, and
:meth:`Preprocessor.transform` (pandas, what serving uses) calls it too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from airflow_ray_ml_stages.constants import is_missing
from airflow_ray_ml_stages.errors import DataSourceError, SpecError
from airflow_ray_ml_stages.spec_base import is_number

FORMAT = "rayml.preprocessor/1"
ONE_HOT_SEPARATOR = "="

# The words of a boolean column, compared without case or surrounding spaces: a column whose values
# are all among them is read as booleans (see airflow_ray_ml_stages.data.schema).
TRUE_WORDS = frozenset({"true", "yes"})
FALSE_WORDS = frozenset({"false", "no"})
BOOLEAN_WORDS = TRUE_WORDS | FALSE_WORDS


def boolean_number(value: Any) -> float | None:
    """A boolean column's value as 1.0 or 0.0, NaN where missing, None where it is not a boolean.

    Taken: JSON/Python/numpy booleans, the words (any case), and the numbers 0 and 1 (what a tool
    that writes booleans as numbers gives).
    """
    if value is None:
        return math.nan
    if isinstance(value, (bool, np.bool_)):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float, np.integer, np.floating)):
        number = float(value)
        if math.isnan(number):
            return math.nan
        return number if number in (0.0, 1.0) else None
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return 1.0
        if word in FALSE_WORDS:
            return 0.0
    return None


def boolean_numbers(values) -> tuple[np.ndarray, np.ndarray]:
    """Values of a boolean column as float64 1/0 (NaN: missing or not a boolean), and where they are not booleans."""
    distinct: dict[Any, float | None] = {}
    numbers = np.empty(len(values), dtype="float64")
    invalid = np.zeros(len(values), dtype=bool)
    for index, value in enumerate(values):
        key = (type(value), value) if isinstance(value, (str, bool, int)) else None
        number = distinct[key] if key in distinct else boolean_number(value)
        if key is not None:
            distinct[key] = number
        numbers[index] = math.nan if number is None else number
        invalid[index] = number is None
    return numbers, invalid


@dataclass
class Moments:
    """Count, mean, sum of squared deviations, min and max of several columns, mergeable.

    Merging uses Chan et al.'s pairwise update, which stays accurate where ``sum(x**2)`` would not.
    ``count`` is the rows counted; where a column has missing values (NaN, kept by
    ``nan_policy='impute'``) the moments are of each column's present values, and ``present``
    holds each column's count of them (None: every column has ``count``).
    """

    count: int
    mean: np.ndarray
    m2: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray
    present: np.ndarray | None = None

    @classmethod
    def empty(cls, width: int) -> "Moments":
        return cls(0, np.zeros(width), np.zeros(width), np.full(width, np.inf), np.full(width, -np.inf))

    @classmethod
    def of(cls, values: np.ndarray) -> "Moments":
        """Moments of a 2-D array (rows x columns) of floats; NaN is a missing value (see ``present``)."""
        if values.shape[0] == 0:
            return cls.empty(values.shape[1])
        missing = np.isnan(values)
        if not missing.any():
            mean = values.mean(axis=0)
            return cls(int(values.shape[0]), mean, ((values - mean) ** 2).sum(axis=0),
                       values.min(axis=0), values.max(axis=0))
        present = (~missing).sum(axis=0)
        safe = np.where(missing, 0.0, values)
        mean = np.divide(safe.sum(axis=0), present, out=np.zeros(values.shape[1]), where=present > 0)
        m2 = np.where(missing, 0.0, (values - mean) ** 2).sum(axis=0)
        return cls(int(values.shape[0]), mean, m2, np.where(missing, np.inf, values).min(axis=0),
                   np.where(missing, -np.inf, values).max(axis=0), present.astype(np.int64))

    @property
    def counts(self) -> np.ndarray:
        """Each column's count of present values."""
        return np.full(self.mean.shape, self.count, dtype=np.int64) if self.present is None else self.present

    def merge(self, other: "Moments") -> "Moments":
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        mine, theirs = self.counts, other.counts
        count = mine + theirs
        delta = other.mean - self.mean
        share = np.divide(theirs, count, out=np.zeros(count.shape), where=count > 0)
        mean = self.mean + delta * share
        cross = np.divide(mine * theirs, count, out=np.zeros(count.shape), where=count > 0)
        m2 = self.m2 + other.m2 + delta**2 * cross
        rows = self.count + other.count
        return Moments(rows, mean, m2, np.minimum(self.minimum, other.minimum),
                       np.maximum(self.maximum, other.maximum),
                       None if self.present is None and other.present is None else count)

    def filled(self, values: np.ndarray) -> "Moments":
        """The moments once each column's missing values are ``values`` (what imputing them gives)."""
        missing = self.count - self.counts
        if not missing.any():
            return Moments(self.count, self.mean, self.m2, self.minimum, self.maximum)
        block = Moments(self.count, np.asarray(values, dtype="float64"), np.zeros(self.mean.shape),
                        np.where(missing > 0, values, np.inf), np.where(missing > 0, values, -np.inf), missing)
        merged = Moments(self.count, self.mean, self.m2, self.minimum, self.maximum, self.counts).merge(block)
        return Moments(self.count, merged.mean, merged.m2, merged.minimum, merged.maximum)

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation (ddof=0), as scikit-learn's and Ray Data's scalers use."""
        counts = self.counts
        return np.sqrt(np.divide(self.m2, counts, out=np.full(self.mean.shape, np.nan), where=counts > 0))

    def to_dict(self) -> dict[str, Any]:
        data = {"count": self.count, "mean": self.mean.tolist(), "m2": self.m2.tolist(),
                "minimum": self.minimum.tolist(), "maximum": self.maximum.tolist()}
        if self.present is not None:
            data["present"] = self.present.tolist()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Moments":
        present = data.get("present")
        return cls(int(data["count"]), *(np.asarray(data[key], dtype="float64")
                                         for key in ("mean", "m2", "minimum", "maximum")),
                   None if present is None else np.asarray(present, dtype=np.int64))

    def columns(self, width: int) -> "Moments":
        """The first ``width`` columns."""
        return Moments(self.count, self.mean[:width], self.m2[:width], self.minimum[:width], self.maximum[:width],
                       None if self.present is None else self.present[:width])



@dataclass
class Preprocessor:
    """Numeric scaling, boolean 0/1 and one-hot encoding, fitted on the training split.

    :param scaler: ``standard`` (``(x - mean) / std``), ``minmax`` (``(x - min) / (max - min)``)
        or ``none``. A constant column (std or range 0) is only centred/shifted, never divided by 0.
    :param numeric_columns: input columns scaled, in output order.
    :param categories: per categorical column, its training categories in output order; a value
        not seen in training encodes as all zeros.
    :param statistics: per numeric column ``{"mean", "std"}`` or ``{"min", "max"}``.
    :param label_column: the label, kept out of the features.
    :param task: ``regression`` (the splits hold the label as it is) or ``classification``.
    :param classes: classification only: the label's values (integers, or strings for a text
        label), in the order of the class indexes the splits hold as the label.
    :param boolean_columns: input columns of booleans, each one model input of 1.0 (true) or 0.0
        (false), unscaled, after the numeric columns. A preprocessor saved before booleans were
        told apart has none (such a column is one of its categories) and works as it did.
    :param fill: ``nan_policy='impute'``: each input column's value for a missing one, fitted on
        the training split (a numeric or boolean column's median, a category's most frequent
        value). The transform keeps a missing value (None, NaN, an empty or ``NA`` text) missing:
        NaN, in every one-hot column of a category, so XGBoost treats it as missing itself; the other
        families fill it with :meth:`fill_vector` (what imputing the raw value gives). Empty: the
        data had no missing value to impute (a missing category encodes as all zeros, as an unseen one).
    :param reference: per input column, its training distribution, which batch scoring measures a
        file's drift against (:mod:`airflow_ray_ml_stages.drift`): decile edges and the share in each
        bin (numbers, booleans), each category's share, and the share of missing values. Empty in a
        preprocessor saved before drift reports: its models score without one.
    """

    scaler: str
    numeric_columns: list[str]
    categories: dict[str, list[str]] = field(default_factory=dict)
    statistics: dict[str, dict[str, float]] = field(default_factory=dict)
    label_column: str = ""
    task: str = "regression"
    classes: list[Any] | None = None
    boolean_columns: list[str] = field(default_factory=list)
    fill: dict[str, float | str] = field(default_factory=dict)
    reference: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def fit(cls, scaler: str, numeric_columns: list[str], moments: Moments,
            categories: dict[str, list[str]], label_column: str, task: str = "regression",
            classes: list[Any] | None = None, boolean_columns: list[str] | None = None,
            fill: dict[str, float | str] | None = None,
            reference: dict[str, dict[str, Any]] | None = None) -> "Preprocessor":
        """Build the preprocessor from the training split's moments (of the imputed values, with ``fill``) and categories."""
        statistics: dict[str, dict[str, float]] = {}
        if scaler == "standard":
            for index, column in enumerate(numeric_columns):
                statistics[column] = {"mean": float(moments.mean[index]), "std": float(moments.std[index])}
        elif scaler == "minmax":
            for index, column in enumerate(numeric_columns):
                statistics[column] = {"min": float(moments.minimum[index]), "max": float(moments.maximum[index])}
        return cls(scaler, list(numeric_columns), {k: list(v) for k, v in categories.items()}, statistics, label_column,
                   task, None if classes is None else list(classes), list(boolean_columns or []), dict(fill or {}),
                   dict(reference or {}))

    @property
    def input_columns(self) -> list[str]:
        return [*self.numeric_columns, *self.boolean_columns, *self.categories]

    @property
    def output_columns(self) -> list[str]:
        one_hot = [f"{column}{ONE_HOT_SEPARATOR}{value}" for column, values in self.categories.items() for value in values]
        return [*self.numeric_columns, *self.boolean_columns, *one_hot]

    def input_types(self) -> dict[str, str]:
        """Each input column with its type: ``number``, ``boolean`` or ``category``, in input order."""
        return {**{column: "number" for column in self.numeric_columns},
                **{column: "boolean" for column in self.boolean_columns},
                **{column: "category" for column in self.categories}}

    def _scale_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Per numeric column: subtract the first array, divide by the second."""
        width = len(self.numeric_columns)
        if self.scaler == "none":
            return np.zeros(width), np.ones(width)
        if self.scaler == "standard":
            shift = np.array([self.statistics[c]["mean"] for c in self.numeric_columns], dtype="float64")
            scale = np.array([self.statistics[c]["std"] for c in self.numeric_columns], dtype="float64")
        else:
            shift = np.array([self.statistics[c]["min"] for c in self.numeric_columns], dtype="float64")
            scale = np.array([self.statistics[c]["max"] - self.statistics[c]["min"] for c in self.numeric_columns],
                             dtype="float64")
        return shift, np.where(scale > 0, scale, 1.0)

    def transform(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Return the model inputs for ``frame`` (raw columns) as float64 columns in output order.

        A boolean column's values are read with :func:`boolean_number` (one that is not a boolean: NaN).
        """
        import pandas as pd

        missing = [column for column in self.input_columns if column not in frame.columns]
        if missing:
            raise DataSourceError(
                f"the batch lacks column(s) {missing} that the preprocessor needs; it has {list(frame.columns)}"
            )
        categorical = {}
        for column in self.categories:
            codes, uniques = pd.factorize(frame[column].to_numpy(dtype=object), use_na_sentinel=True)
            if self.fill:  # an empty or NA text is a missing value, as in training
                missing = np.array([is_missing(value) for value in uniques] + [True])
                codes = np.where(missing[codes], -1, codes)
            categorical[column] = (codes, list(uniques))
        numeric = np.empty((len(frame), len(self.numeric_columns) + len(self.boolean_columns)), dtype="float64")
        numeric[:, : len(self.numeric_columns)] = frame[self.numeric_columns].to_numpy(dtype="float64")
        for index, column in enumerate(self.boolean_columns, start=len(self.numeric_columns)):
            numeric[:, index] = boolean_numbers(frame[column].to_numpy(dtype=object))[0]
        matrix = self.transform_arrays(numeric, categorical)
        return pd.DataFrame(matrix, columns=self.output_columns, index=frame.index)

    def transform_arrays(self, numeric: np.ndarray, categorical: dict[str, tuple[np.ndarray, list]]) -> np.ndarray:
        """The model inputs as one float64 matrix in output order.

        :param numeric: rows x (``numeric_columns``, then ``boolean_columns`` as 1/0) (float64; not modified).
        :param categorical: per categorical column, each row's code into its distinct values and
            those values (code -1: missing, encoded as all zeros like an unseen value).
        """
        shift, scale = self._scale_arrays()
        rows = numeric.shape[0]
        plain = len(self.numeric_columns) + len(self.boolean_columns)
        width = plain + sum(len(values) for values in self.categories.values())
        matrix = np.empty((rows, width), dtype="float64", order="F")  # columns contiguous: zero-copy to Arrow
        scaled = matrix[:, : len(self.numeric_columns)]
        np.subtract(numeric[:, : len(self.numeric_columns)], shift, out=scaled)
        scaled /= scale
        matrix[:, len(self.numeric_columns): plain] = numeric[:, len(self.numeric_columns): plain]
        start = plain
        for column, trained in self.categories.items():
            codes, values = categorical[column]
            position = {value: index for index, value in enumerate(trained)}
            # Each distinct value's index among the training categories (-1: unseen), then per row.
            lookup = np.array([position.get(value, -1) if isinstance(value, str) else -1 for value in values] + [-1],
                              dtype="int64")
            index = lookup[codes]
            block = matrix[:, start: start + len(trained)]
            block[:] = index[:, None] == np.arange(len(trained))
            if self.fill:  # a missing value (code -1) stays missing: NaN in each of its columns
                block[codes < 0] = np.nan
            start += len(trained)
        return matrix

    def fill_vector(self) -> np.ndarray | None:
        """Per output column, what a missing value becomes once imputed, in this preprocessor's scaling:
        the scaled median, the boolean's median, 1.0 in the most frequent category's one-hot column
        and 0.0 in the others. None where it imputes nothing."""
        if not self.fill:
            return None
        shift, scale = self._scale_arrays()
        numbers = (np.array([self.fill[column] for column in self.numeric_columns], dtype="float64") - shift) / scale
        booleans = [float(self.fill[column]) for column in self.boolean_columns]
        one_hot = [1.0 if self.fill[column] == value else 0.0 for column, values in self.categories.items()
                   for value in values]
        return np.concatenate([numbers, booleans, one_hot]).astype("float64")

    def to_dict(self) -> dict[str, Any]:
        data = {"format": FORMAT, "scaler": self.scaler, "numeric_columns": self.numeric_columns,
                "categories": self.categories, "statistics": self.statistics,
                "label_column": self.label_column, "output_columns": self.output_columns, "task": self.task}
        if self.classes is not None:
            data["classes"] = self.classes
        if self.boolean_columns:  # absent otherwise: such a file reads as it did before booleans
            data["boolean_columns"] = self.boolean_columns
        if self.fill:  # absent otherwise: missing values are not imputed
            data["fill"] = self.fill
        if self.reference:  # absent in a preprocessor saved before drift reports
            data["reference"] = self.reference
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Preprocessor":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise SpecError(f"not a preprocessor in format {FORMAT!r}: found {found!r}")
        categories = {k: list(v) for k, v in data["categories"].items()}
        output = data.get("output_columns")
        if isinstance(output, list):
            # The file is written with sorted keys, so the object loses the categorical columns' order;
            # the output columns (the model's input order) keep it: each column sits where its first
            # one-hot column does.
            where = {name: index for index, name in enumerate(output) if isinstance(name, str)}
            categories = dict(sorted(categories.items(), key=lambda item: where.get(
                f"{item[0]}{ONE_HOT_SEPARATOR}{item[1][0]}" if item[1] else "", len(output))))
        preprocessor = cls(data["scaler"], list(data["numeric_columns"]), categories,
                           {k: {s: float(x) for s, x in v.items()} for k, v in data["statistics"].items()},
                           data.get("label_column", ""), data.get("task", "regression"), data.get("classes"),
                           list(data.get("boolean_columns", [])), dict(data.get("fill") or {}),
                           dict(data.get("reference") or {}))
        unknown = sorted(set(preprocessor.fill) - set(preprocessor.input_columns))
        wrong = [column for column, value in preprocessor.fill.items() if column in preprocessor.categories
                 and value not in preprocessor.categories[column] or column not in preprocessor.categories
                 and not is_number(value)]
        if unknown or wrong:
            raise SpecError(f"preprocessor JSON is inconsistent: fill names column(s) {unknown} it does not have, or "
                            f"gives {wrong} a value that is not a number or not one of the column's categories")
        if (preprocessor.task == "classification") != isinstance(preprocessor.classes, list):
            raise SpecError(f"preprocessor JSON is inconsistent: task {preprocessor.task!r} with classes "
                            f"{preprocessor.classes!r} (a classification preprocessor lists its classes, only it)")
        if data.get("output_columns") not in (None, preprocessor.output_columns):
            raise SpecError(f"preprocessor JSON is inconsistent: output_columns {data['output_columns']!r} "
                            f"do not match its columns and categories")
        return preprocessor

    @classmethod
    def from_json(cls, text: str | bytes) -> "Preprocessor":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SpecError(f"preprocessor JSON is not valid JSON: {err}") from err
        return cls.from_dict(data)

    @classmethod
    def load(cls, uri: str) -> "Preprocessor":
        """Read a preprocessor written by the ``data`` stage (local path, s3://, gs://)."""
        from airflow_ray_ml_stages import artifacts

        return cls.from_json(artifacts.read_bytes(uri))


def input_types_of(preprocessor_json: str | bytes) -> dict[str, str] | None:
    """The input types (:meth:`Preprocessor.input_types`) of a preprocessor file, for a model card.

    None where the file is not a preprocessor in :data:`FORMAT` (a model trained on splits made
    elsewhere still gets its card; only this field stays empty).
    """
    try:
        return Preprocessor.from_json(preprocessor_json).input_types()
    except (SpecError, KeyError, TypeError, AttributeError, ValueError):
        return None


def _without_round_off(values: np.ndarray, reference: np.ndarray, digits: int = 12) -> np.ndarray:
    """``values`` rounded to ``digits`` significant decimal digits of ``max(|value|, reference)``.

    Undoing the scaling, ``z * scale + shift``, errs by a few float64 ulps of the larger of the value
    and the column's ``|shift| + |scale|`` (``reference``); 12 digits of that size drop the error.
    """
    size = np.maximum(np.abs(values), reference)
    finite = np.isfinite(values) & (size > 0)
    factor = 10.0 ** (digits - 1 - np.floor(np.log10(np.where(finite, size, 1.0))))
    return np.where(finite, np.round(values * factor) / factor, values)


def inverse_transform(preprocessor: Preprocessor, features: pd.DataFrame) -> pd.DataFrame:
    """Raw rows back from model inputs: undo the scaling, and decode boolean and one-hot columns.

    Used to send rows of a preprocessed split to an endpoint that takes raw features (the
    deployment smoke test); booleans come back as ``True``/``False`` (JSON booleans); a row whose
    one-hot columns are all zero decodes to ``None``. Numbers
    come back without the scaling's round-off (``1511.9999999999998`` is 1512 again): as the file
    gave them, to 12 significant digits of the column's scale.
    """
    import pandas as pd

    shift, scale = preprocessor._scale_arrays()
    numeric = _without_round_off(features[preprocessor.numeric_columns].to_numpy(dtype="float64") * scale + shift,
                                 np.abs(shift) + np.abs(scale))
    raw = pd.DataFrame(numeric, columns=preprocessor.numeric_columns, index=features.index)
    for column in preprocessor.boolean_columns:
        raw[column] = pd.Series([None if np.isnan(value) else bool(value > 0.5)
                                 for value in features[column].to_numpy(dtype="float64")], index=features.index,
                                dtype=object)
    for column, values in preprocessor.categories.items():
        one_hot = features[[f"{column}{ONE_HOT_SEPARATOR}{value}" for value in values]].to_numpy()
        chosen = np.asarray(values, dtype=object)[one_hot.argmax(axis=1)] if values else np.full(len(raw), None)
        raw[column] = np.where(one_hot.max(axis=1) > 0.5, chosen, None) if values else chosen
    return raw


def raw_split_rows(split_uri: str, preprocessor: Preprocessor,
                   limit: int | None = None) -> tuple[list[dict[str, Any]], list[Any]]:
    """Rows of a preprocessed split (Parquet) as raw feature dicts, and their labels.

    What an endpoint that takes raw features accepts: the deployment's smoke test and the sample
    prediction of ``make run`` send these rows.
    """
    import pyarrow.dataset as ds

    from airflow_ray_ml_stages import artifacts

    filesystem, path = artifacts.resolve(split_uri)
    table = ds.dataset(path, filesystem=filesystem, format="parquet").to_table()
    frame = (table if limit is None else table.slice(0, limit)).to_pandas()
    labels = frame[preprocessor.label_column].tolist()
    raw = inverse_transform(preprocessor, frame)
    # a missing value (NaN in the splits, nan_policy impute) is JSON's null, as a client sends it
    raw = raw.astype(object).where(raw.notna(), None)
    return raw.to_dict(orient="records"), labels


def feature_fill(preprocessor_uri: str | None, feature_columns: list[str]) -> list[float] | None:
    """The preprocessor's :meth:`Preprocessor.fill_vector` in ``feature_columns`` order, None where it
    imputes nothing, or there is no preprocessor in :data:`FORMAT` (splits made elsewhere: nothing to
    impute from, as :func:`input_types_of` reads such a file)."""
    if not preprocessor_uri:
        return None
    try:
        preprocessor = Preprocessor.load(preprocessor_uri)
    except (SpecError, KeyError, TypeError, AttributeError, ValueError):
        return None
    values = preprocessor.fill_vector()
    if values is None:
        return None
    by_name = dict(zip(preprocessor.output_columns, values.tolist()))
    missing = [column for column in feature_columns if column not in by_name]
    if missing:
        raise SpecError(f"feature_columns {missing} are not the preprocessor's output columns")
    return [by_name[column] for column in feature_columns]


def fill_missing(features: np.ndarray, fill: np.ndarray | list[float] | None) -> np.ndarray:
    """``features`` with each NaN replaced by its column's ``fill`` (the same array where none is missing)."""
    if fill is None:
        return features
    missing = np.isnan(features)
    if not missing.any():
        return features
    return np.where(missing, np.asarray(fill, dtype=features.dtype), features).astype(features.dtype, copy=False)


def apply_affine(features: np.ndarray, multiply, add) -> np.ndarray:
    """float32 features mapped by :func:`feature_affine`'s ``(multiply, add)``, computed in float64."""
    return (np.asarray(features).astype(np.float64) * np.asarray(multiply, dtype=np.float64)
            + np.asarray(add, dtype=np.float64)).astype(np.float32)


def feature_affine(written: Preprocessor, target: Preprocessor, feature_columns: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per feature column ``(multiply, add)`` that turns data scaled by ``written`` into ``target``'s scaling.

    ``target.transform(raw) == written.transform(raw) * multiply + add`` for every numeric column
    (both are affine in the raw value: undo one, apply the other); one-hot and other columns keep
    ``multiply = 1, add = 0``. No refit: tuning trials and the train stage switch scalers with this.
    """
    if written.numeric_columns != target.numeric_columns:
        raise SpecError(
            f"preprocessor variants disagree on their numeric columns: {written.numeric_columns!r} vs "
            f"{target.numeric_columns!r}; both must come from the same preprocess run"
        )
    missing = [column for column in written.numeric_columns if column not in feature_columns]
    if missing:
        raise SpecError(f"feature_columns {feature_columns!r} lack the preprocessor's numeric column(s) {missing}")
    written_shift, written_scale = written._scale_arrays()
    target_shift, target_scale = target._scale_arrays()
    multiply = np.ones(len(feature_columns))
    add = np.zeros(len(feature_columns))
    for index, column in enumerate(written.numeric_columns):
        position = feature_columns.index(column)
        # raw = x * written_scale + written_shift;  new = (raw - target_shift) / target_scale
        multiply[position] = written_scale[index] / target_scale[index]
        add[position] = (written_shift[index] - target_shift[index]) / target_scale[index]
    return multiply, add
