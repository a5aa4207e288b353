"""PyTorch Lightning's side of tests/e2e/test_lightning_checkpoints.py, run as its own process.

It runs under /usr/bin/python3 (Debian's torch 1.13) with Lightning 1.9.5 or 2.2.5 from PyPI on
PYTHONPATH (scripts/setup.sh installs each into a folder of its own), so the pytest process that
starts it keeps a plain torch. Commands (each prints one JSON object on its last line):

  train OUT_DIR        trains the example's MLP twin one epoch and saves OUT_DIR/last.ckpt
  resume CKPT DIRPATH  load_from_checkpoint(CKPT), then Trainer.fit(ckpt_path=CKPT) for one more
                       epoch, with a ModelCheckpoint on DIRPATH; reports what it restored
"""
import json
import sys

import torch
import torch.distributed

# Debian's torch 1.13 cannot import torch.distributed._shard on Python 3.11 (a dataclass with a
# mutable default), and Lightning imports it whenever torch.distributed is available. These runs
# are single-process, so Lightning is told there is no torch.distributed.
torch.distributed.is_available = lambda: False

import pytorch_lightning as pl  # noqa: E402
from torch import nn  # noqa: E402


class FashionMnistTwin(pl.LightningModule):
    """examples/fashion_mnist's MLP, hyperparameters and optimizers, in Python (same names)."""

    def __init__(self, model="mlp", lr=1e-3, lr_gamma=0.5, batch_size=64, hidden=256, val_size=5000):
        super().__init__()
        assert model == "mlp", model
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 10))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = nn.functional.cross_entropy(self.net(images), labels)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        logits = self.net(images)
        self.log("val/loss", nn.functional.cross_entropy(logits, labels))
        self.log("val/acc", (logits.argmax(1) == labels).double().mean())

    def configure_optimizers(self):
        adam = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(adam, 1, self.hparams.lr_gamma)
        return {"optimizer": adam, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


class Probe(pl.Callback):
    """Records what the Trainer restored, before it trains on."""

    def __init__(self):
        self.seen = {"epochs_trained": []}

    def on_train_start(self, trainer, module):
        optimizer = trainer.optimizers[0]
        steps = {float(state["step"]) for state in optimizer.state.values()}
        checkpoint = trainer.checkpoint_callback
        stopping = trainer.early_stopping_callback
        self.seen.update({
            "current_epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "adam_steps": sorted(steps),
            "lr": optimizer.param_groups[0]["lr"],
            "scheduler_last_epoch": trainer.lr_scheduler_configs[0].scheduler.last_epoch,
            "best_model_path": checkpoint.best_model_path,
            "best_model_score": None if checkpoint.best_model_score is None else float(checkpoint.best_model_score),
            "early_stopping_best_score": float(stopping.best_score),
            "early_stopping_wait_count": stopping.wait_count,
        })

    def on_train_epoch_start(self, trainer, module):
        self.seen["epochs_trained"].append(trainer.current_epoch)


def loaders():
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(64, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (64,), generator=generator)
    data = torch.utils.data.TensorDataset(images, labels)
    return torch.utils.data.DataLoader(data, batch_size=16), torch.utils.data.DataLoader(data, batch_size=32)


def trainer(max_epochs, dirpath, probe=None):
    callbacks = [pl.callbacks.ModelCheckpoint(dirpath=dirpath, monitor="val/acc", mode="max", save_last=True),
                 pl.callbacks.EarlyStopping(monitor="val/loss", patience=3)]
    if probe is not None:
        callbacks.append(probe)
    return pl.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=dirpath)


def train(out_dir):
    train_loader, val_loader = loaders()
    module = FashionMnistTwin(hidden=32)
    run = trainer(1, out_dir)
    run.fit(module, train_loader, val_loader)
    return {"checkpoint": f"{out_dir}/last.ckpt", "global_step": run.global_step}


def resume(ckpt, dirpath):
    loaded = FashionMnistTwin.load_from_checkpoint(ckpt)
    saved = torch.load(ckpt)["state_dict"]
    weights_equal = list(loaded.state_dict()) == list(saved) and all(
        torch.equal(loaded.state_dict()[name], tensor) for name, tensor in saved.items())
    train_loader, val_loader = loaders()
    probe = Probe()
    run = trainer(int(torch.load(ckpt)["epoch"]) + 2, dirpath, probe)
    run.fit(FashionMnistTwin(**loaded.hparams), train_loader, val_loader, ckpt_path=ckpt)
    return {"hparams": dict(loaded.hparams), "weights_equal": weights_equal, **probe.seen,
            "final_global_step": run.global_step, "last": run.checkpoint_callback.last_model_path}


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    result = {"train": train, "resume": resume}[command](*args)
    print(json.dumps({"lightning": pl.__version__, **result}))
