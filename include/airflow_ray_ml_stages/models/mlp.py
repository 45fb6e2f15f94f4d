"""The Lightning family's model: an MLP regressor, as a plain ``nn.Module`` and a LightningModule.

The plain module is what the model directory stores (``model.pt``, a state_dict of tensors only)
and what :func:`airflow_ray_ml_stages.models.load_model` rebuilds outside Ray from ``model_config.json``; the
LightningModule only adds the optimisation around it, for training.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def build_mlp(n_features: int, hidden_sizes: list[int], dropout: float) -> nn.Sequential:
    """Linear -> ReLU -> Dropout blocks, then one linear output (the predicted grade)."""
    layers: list[nn.Module] = []
    width = n_features
    for size in hidden_sizes:
        layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)]
        width = size
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def model_config(n_features: int, hidden_sizes: list[int], dropout: float, label_offset: float) -> dict[str, Any]:
    """What ``model_config.json`` holds: enough to rebuild the module without pickle."""
    return {"n_features": n_features, "hidden_sizes": list(hidden_sizes), "dropout": dropout,
            "label_offset": label_offset}


class MLPRegressor(nn.Module):
    """The MLP plus a constant offset (the training label mean), so the net learns the residual."""

    def __init__(self, n_features: int, hidden_sizes: list[int], dropout: float = 0.0, label_offset: float = 0.0):
        super().__init__()
        self.net = build_mlp(n_features, hidden_sizes, dropout)
        self.register_buffer("label_offset", torch.tensor(float(label_offset)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1) + self.label_offset


def lightning_module(config: dict[str, Any], n_features: int, label_offset: float):
    """A LightningModule wrapping :class:`MLPRegressor` (imported here: serving needs no Lightning)."""
    import pytorch_lightning as pl

    class MLPLightningModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = MLPRegressor(n_features, config["hidden_sizes"], config["dropout"], label_offset)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return self.model(features)

        def _loss(self, batch) -> torch.Tensor:
            features, labels = batch
            return nn.functional.mse_loss(self(features), labels)

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
