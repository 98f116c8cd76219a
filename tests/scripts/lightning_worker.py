"""Lightning 2.x on pushpull (pushpull.lightning.PushPullStrategy): a LightningModule on scikit-learn's digits,
under pushpull launch (2 workers) or alone. Prints the validation accuracy (logged with sync_dist=True) and
whether every worker ends with identical parameters."""
import sys

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits

import pushpull.torch as bps
from pushpull.lightning import PushPullStrategy


class Digits(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        acc = (self.net(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05 * bps.size(), momentum=0.9)


torch.set_num_threads(1)
bps.init()
epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 6
d = load_digits()
x = torch.tensor(d.data, dtype=torch.float32) / 16.0
y = torch.tensor(d.target)
g = torch.Generator().manual_seed(0)
perm = torch.randperm(len(x), generator=g)
tr, te = perm[:1437], perm[1437:]
train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[tr], y[tr]), batch_size=32, shuffle=True)
val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[te], y[te]), batch_size=64)
torch.manual_seed(bps.rank())  # different initial weights: the strategy's start broadcast must fix that
module = Digits()
strategy = PushPullStrategy()
trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=epochs, enable_progress_bar=False,
                     enable_model_summary=False, logger=False, enable_checkpointing=False, gradient_clip_val=1.0)
trainer.fit(module, train, val)
acc = float(trainer.callback_metrics["val_acc"])
flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
same = bool(torch.allclose(bps.allreduce(flat.clone(), op=bps.Sum, name="lightning.check"), flat * bps.size(),
                           atol=1e-6)) if bps.size() > 1 else True
print(f"LIGHTNING rank {bps.rank()} of {bps.size()}: val_acc {acc:.4f}; identical parameters {same}; "
      f"averages {strategy.averages}; train batches {trainer.num_training_batches}", flush=True)
bps.shutdown()
