"""The Lightning family's model: an MLP, as a plain ``nn.Module`` and a LightningModule.

For regression the MLP has one output, the predicted value; for classification one output per
class, the logits (trained with cross-entropy; ``softmax`` of them are the class probabilities).
A regression net learns the standardised label: its output is scaled by the training label's std
and offset by its mean, and the loss is taken on that standardised scale, so a learning rate means
the same whatever the label's units.

The plain module is what the model directory stores (``model.pt``, a state_dict of tensors only)
and what :func:`airflow_ray_ml_stages.models.load_model` rebuilds outside Ray from ``model_config.json``; the
LightningModule only adds the optimisation around it, for training.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def build_mlp(n_features: int, hidden_sizes: list[int], dropout: float, n_outputs: int = 1) -> nn.Sequential:
    """Linear -> ReLU -> Dropout blocks, then a linear output layer (the value, or one logit per class)."""
    layers: list[nn.Module] = []
    width = n_features
    for size in hidden_sizes:
        layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)]
        width = size
    layers.append(nn.Linear(width, n_outputs))
    return nn.Sequential(*layers)


def model_config(n_features: int, hidden_sizes: list[int], dropout: float,
                 label_offset: float | list[float], label_scale: float = 1.0) -> dict[str, Any]:
    """What ``model_config.json`` holds: enough to rebuild the module without pickle.

    ``label_scale`` is absent from model directories written before it existed: read it as 1.0.
    """
    return {"n_features": n_features, "hidden_sizes": list(hidden_sizes), "dropout": dropout,
            "label_offset": label_offset, "label_scale": float(label_scale)}


def label_offset(label_mean: float, class_priors: list[float] | None) -> float | list[float]:
    """The output offset: the training label mean (regression), or each class's log share (classification).

    Either way the untrained net starts from the model that ignores the features, and learns the rest.
    """
    if class_priors is None:
        return float(label_mean)
    return [float(value) for value in torch.log(torch.tensor(class_priors, dtype=torch.float64).clamp_min(1e-6))]


def label_scale(label_std: float, class_priors: list[float] | None) -> float:
    """The regression output's scale: the training label's std (1 for a constant label); 1 for classification.

    The net then predicts the standardised label, whose spread is about 1 whatever the label's units.
    """
    if class_priors is not None or not math.isfinite(label_std) or label_std <= 0:
        return 1.0
    return float(label_std)


class MLP(nn.Module):
    """The MLP plus a constant offset (:func:`label_offset`), so the net learns what the offset misses.

    A scalar offset means regression (one output, squeezed, ``net(x) * label_scale + label_offset``);
    a list, classification (one logit per class, ``net(x) + label_offset``; ``label_scale`` unused).
    """

    def __init__(self, n_features: int, hidden_sizes: list[int], dropout: float = 0.0,
                 label_offset: float | list[float] = 0.0, label_scale: float = 1.0):
        super().__init__()
        offset = torch.tensor(label_offset, dtype=torch.float32)
        self.classification = offset.ndim == 1
        self.net = build_mlp(n_features, hidden_sizes, dropout, len(offset) if self.classification else 1)
        self.register_buffer("label_offset", offset)
        # A plain number, not a buffer: model.pt files written before it existed load unchanged,
        # and model_config.json carries it.
        self.label_scale = 1.0 if self.classification else float(label_scale)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.classification:
            return self.net(features) + self.label_offset
        return (self.net(features) * self.label_scale + self.label_offset).squeeze(-1)

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        """The predictions: values (regression), or class probabilities (the logits' softmax)."""
        out = self(features)
        return torch.softmax(out, dim=-1) if self.classification else out


def lightning_module(config: dict[str, Any], n_features: int, label_offset: float | list[float],
                     label_scale: float = 1.0):
    """A LightningModule wrapping :class:`MLP` (imported here: serving needs no Lightning).

    Its regression loss is the MSE on the standardised scale (divided by ``label_scale**2``). Lightning
    is the package :func:`~airflow_ray_ml_stages.models.lightning_package.import_lightning` decides.
    """
    from airflow_ray_ml_stages.models.lightning_package import import_lightning

    pl = import_lightning()

    class MLPLightningModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = MLP(n_features, config["hidden_sizes"], config["dropout"], label_offset, label_scale)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return self.model(features)

        def _loss(self, batch) -> torch.Tensor:
            features, labels = batch
            if self.model.classification:
                return nn.functional.cross_entropy(self(features), labels.long())
            return nn.functional.mse_loss(self(features), labels) / self.model.label_scale ** 2

        def training_step(self, batch, batch_idx):
            loss = self._loss(batch)
            # The epoch's mean loss is summed here and logged once, at the epoch's last step: a
            # self.log every step cost about a tenth of a step (its bookkeeping, not the arithmetic).
            if batch_idx == 0:
                self._loss_sum, self._rows = torch.zeros((), device=loss.device), 0
            rows = len(batch[1])
            self._loss_sum, self._rows = self._loss_sum + loss.detach() * rows, self._rows + rows
            if batch_idx + 1 >= self.trainer.num_training_batches:
                self.log("train_loss", self._loss_sum / self._rows, on_step=False, on_epoch=True, sync_dist=True)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch), on_step=False, on_epoch=True, sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])

    return MLPLightningModule()
