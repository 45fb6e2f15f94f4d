"""A seeded stand-in for the UCI wine-quality data (Cortez et al. 2009), and its file layout.

The real data cannot be downloaded here, so the project generates tables with the same schema:
red and white Vinho Verde wines, the 11 physicochemical features, an integer ``quality`` grade.
Column ranges, skew and the main correlations follow the published data (density rises with sugar
and falls with alcohol; free and total sulfur dioxide move together; fixed acidity, citric acid and
pH are linked), and quality is a noisy function of alcohol, volatile acidity, sulphates and a few
others, so a model can learn it about as well as it can learn the real grades.
"""

from __future__ import annotations

import re

import numpy as np

FEATURES = (
    "fixed acidity",
    "volatile acidity",
    "citric acid",
    "residual sugar",
    "chlorides",
    "free sulfur dioxide",
    "total sulfur dioxide",
    "density",
    "pH",
    "sulphates",
    "alcohol",
)
LABEL = "quality"
TYPE_COLUMN = "type"
UCI_COLUMNS = (*FEATURES, LABEL)
RED_SHARE = 1599 / 6497  # the published red:white proportion
QUALITY_RANGE = (0, 10)
# Where the demo's model is served: Serve application and route.
DEMO_APP = "wine-quality"
DEMO_ROUTE = "/wine"
DRIFT_ASSET = "wine_quality_model/drift"
"""The Asset the demo's scoring DAG updates when a file it scored has drifted from the served model's
training data (dags/wine_batch_scoring.py): the record of it, which the "Ray ML" page lists."""


def serve_endpoint(label: str | None) -> tuple[str, str]:
    """The Serve application and route for a model of ``label`` when none is named.

    The demo's label keeps the demo's ``wine-quality`` at ``/wine``; any other is named after the
    label (lower case, each run of other characters than letters, digits, ``.``, ``_``, ``-`` one
    ``-``, cut to 63): ``"Monthly Rent"`` serves ``monthly-rent`` at ``/monthly-rent``, so a model of
    another table never replaces the wine model. ``make run LABEL=`` and the wine DAG's Deploy
    Params both name the application with it.
    """
    if not label or label == LABEL:
        return DEMO_APP, DEMO_ROUTE
    app = re.sub(r"[^a-z0-9._-]+", "-", label.lower()).strip("-._")[:63] or "model"
    return app, f"/{app}"


def _lognormal(rng: np.random.Generator, z: np.ndarray, mean: float, std: float) -> np.ndarray:
    """Map standard normals to a log-normal with the given mean and standard deviation."""
    sigma2 = np.log1p((std / mean) ** 2)
    return np.exp(np.log(mean) - sigma2 / 2 + np.sqrt(sigma2) * z)


def _mix(rng: np.random.Generator, correlation: float, driver: np.ndarray) -> np.ndarray:
    """Standard normals correlated with ``driver`` by ``correlation``."""
    noise = rng.standard_normal(driver.shape[0])
    return correlation * driver + np.sqrt(1 - correlation**2) * noise


# Per-type marginal statistics (mean, std) and the strength of the links between columns.
_STATS = {
    "red": {
        "fixed acidity": (8.32, 1.74), "volatile acidity": (0.53, 0.18), "citric acid": (0.27, 0.19),
        "residual sugar": (2.54, 1.41), "chlorides": (0.087, 0.047), "free sulfur dioxide": (15.9, 10.5),
        "total sulfur dioxide": (46.5, 32.9), "pH": (3.31, 0.154), "sulphates": (0.66, 0.17),
        "alcohol": (10.42, 1.07), "density_base": 0.9967, "density_sugar": 0.0005,
        "density_alcohol": -0.0009, "density_acidity": 0.0011, "quality": (5.64, 0.81),
        "sugar_alcohol": 0.04, "quality_weights": {
            "alcohol": 0.48, "volatile acidity": -0.39, "sulphates": 0.25, "citric acid": 0.05,
            "total sulfur dioxide": -0.12, "chlorides": -0.08, "pH": -0.05,
        },
    },
    "white": {
        "fixed acidity": (6.85, 0.84), "volatile acidity": (0.28, 0.10), "citric acid": (0.33, 0.12),
        "residual sugar": (6.39, 5.07), "chlorides": (0.046, 0.022), "free sulfur dioxide": (35.3, 17.0),
        "total sulfur dioxide": (138.4, 42.5), "pH": (3.19, 0.151), "sulphates": (0.49, 0.114),
        "alcohol": (10.51, 1.23), "density_base": 0.9940, "density_sugar": 0.0022,
        "density_alcohol": -0.0013, "density_acidity": 0.0004, "quality": (5.88, 0.89),
        "sugar_alcohol": -0.45, "quality_weights": {
            "alcohol": 0.45, "volatile acidity": -0.20, "sulphates": 0.05, "citric acid": 0.0,
            "total sulfur dioxide": -0.08, "chlorides": -0.12, "pH": 0.05,
            "free sulfur dioxide": 0.08, "residual sugar": 0.12,
        },
    },
}

_RANGES = {
    "fixed acidity": (3.8, 15.9), "volatile acidity": (0.08, 1.58), "citric acid": (0.0, 1.66),
    "residual sugar": (0.6, 65.8), "chlorides": (0.009, 0.611), "free sulfur dioxide": (1.0, 289.0),
    "total sulfur dioxide": (6.0, 440.0), "density": (0.98711, 1.03898), "pH": (2.72, 4.01),
    "sulphates": (0.22, 2.0), "alcohol": (8.0, 14.9),
}

_DECIMALS = {
    "fixed acidity": 1, "volatile acidity": 3, "citric acid": 2, "residual sugar": 1, "chlorides": 3,
    "free sulfur dioxide": 0, "total sulfur dioxide": 0, "density": 5, "pH": 2, "sulphates": 2,
    "alcohol": 1,
}


def _generate_type(rng: np.random.Generator, kind: str, rows: int) -> pd.DataFrame:
    import pandas as pd

    stats = _STATS[kind]
    z_acid = rng.standard_normal(rows)
    z_alcohol = rng.standard_normal(rows)
    z_sugar = _mix(rng, stats["sugar_alcohol"], z_alcohol)
    z_citric = _mix(rng, 0.67 if kind == "red" else 0.29, z_acid)
    z_volatile = _mix(rng, -0.55 if kind == "red" else -0.15, z_citric)
    z_ph = _mix(rng, -0.68 if kind == "red" else -0.43, z_acid)
    z_free = rng.standard_normal(rows)
    z_total = _mix(rng, 0.67 if kind == "red" else 0.62, z_free)
    z_chlorides = _mix(rng, -0.25 if kind == "red" else -0.36, z_alcohol)
    z_sulphates = _mix(rng, 0.37 if kind == "red" else 0.0, z_chlorides)

    def normal(column: str, z: np.ndarray) -> np.ndarray:
        mean, std = stats[column]
        return mean + std * z

    def skewed(column: str, z: np.ndarray) -> np.ndarray:
        mean, std = stats[column]
        return _lognormal(rng, z, mean, std)

    table = {
        "fixed acidity": normal("fixed acidity", z_acid),
        "volatile acidity": skewed("volatile acidity", z_volatile),
        "citric acid": np.clip(normal("citric acid", z_citric), 0.0, None),
        "residual sugar": skewed("residual sugar", z_sugar),
        "chlorides": skewed("chlorides", z_chlorides),
        "free sulfur dioxide": skewed("free sulfur dioxide", z_free),
        "total sulfur dioxide": skewed("total sulfur dioxide", z_total),
        "pH": normal("pH", z_ph),
        "sulphates": skewed("sulphates", z_sulphates),
        "alcohol": normal("alcohol", z_alcohol),
    }
    sugar_mean, sugar_std = stats["residual sugar"]
    table["density"] = (
        stats["density_base"]
        + stats["density_sugar"] * (table["residual sugar"] - sugar_mean) / sugar_std
        + stats["density_alcohol"] * z_alcohol
        + stats["density_acidity"] * z_acid
        + 0.0004 * rng.standard_normal(rows)
    )
    for column, (low, high) in _RANGES.items():
        table[column] = np.round(np.clip(table[column], low, high), _DECIMALS[column])

    # Quality: a weighted sum of standardised features (the learnable part) plus noise, scaled to
    # the published mean and spread and rounded to whole grades.
    signal = np.zeros(rows)
    for column, weight in stats["quality_weights"].items():
        values = table[column]
        signal += weight * (values - values.mean()) / (values.std() + 1e-12)
    signal /= signal.std() + 1e-12
    latent = 0.72 * signal + 0.69 * rng.standard_normal(rows)
    quality_mean, quality_std = stats["quality"]
    quality = np.clip(np.rint(quality_mean + quality_std * latent), 3, 9).astype("int64")

    frame = pd.DataFrame({column: table[column] for column in FEATURES})
    frame[LABEL] = quality
    return frame


def generate(rows: int = 6497, seed: int = 7) -> pd.DataFrame:
    """Return ``rows`` generated wines, red first, with the UCI columns plus ``type``."""
    import pandas as pd

    if rows < 2:
        raise ValueError(f"rows must be at least 2 (one red, one white), got {rows!r}")
    rng = np.random.default_rng(seed)
    red_rows = min(max(1, round(rows * RED_SHARE)), rows - 1)
    parts = []
    for kind, count in (("red", red_rows), ("white", rows - red_rows)):
        part = _generate_type(rng, kind, count)
        part.insert(0, TYPE_COLUMN, kind)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def to_uci_csv(frame: pd.DataFrame) -> bytes:
    """Serialise one colour's rows exactly as the UCI files are published: ``;`` and quoted header."""
    columns = [column for column in UCI_COLUMNS if column in frame.columns]  # no label: new wines
    header = ";".join(f'"{column}"' for column in columns)
    body = frame.loc[:, columns].to_csv(sep=";", header=False, index=False, lineterminator="\n")
    return (header + "\n" + body).encode("utf-8")
