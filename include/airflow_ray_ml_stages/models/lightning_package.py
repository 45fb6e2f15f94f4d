"""The one place that decides which Lightning package the stages and models use.

Lightning ships under two names: ``lightning`` (whose ``lightning.pytorch`` is the trainer) and the
standalone ``pytorch-lightning`` (``pytorch_lightning``); GPU images often have both. Their classes
are distinct, so a Trainer of one refuses a strategy or callback of the other. Ray's Lightning
utilities (``RayDDPStrategy``, ``RayTrainReportCallback``, ...) take ``lightning.pytorch`` whenever it
imports, else ``pytorch_lightning``; :func:`import_lightning` decides the same way, so every class
the loops hand a Trainer comes from one package, whichever of the two (or both) is installed.

Every Lightning import in the stages and models goes through here (a test keeps it so).
"""

from __future__ import annotations

from types import ModuleType

def import_lightning() -> ModuleType:
    """``lightning.pytorch`` if it imports, else ``pytorch_lightning``; the fix when neither does."""
    try:
        import lightning.pytorch as pl
    except ModuleNotFoundError:
        try:
            import pytorch_lightning as pl
        except ModuleNotFoundError as missing:
            raise ModuleNotFoundError(
                "the lightning family needs Lightning: install the ml extra (pip install 'airflow-ray-ml[ml]'), "
                "which brings pytorch-lightning, or the lightning package") from missing
    return pl


def lightning_versions(pl: ModuleType) -> dict[str, str]:
    """What a model card records of the Lightning used: ``{import name: version}``.

    The key says which package trained the model (``lightning.pytorch`` or ``pytorch_lightning``).
    """
    return {pl.__name__: pl.__version__}
