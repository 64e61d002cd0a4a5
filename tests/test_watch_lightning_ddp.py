"""TorchlensCallback under Lightning's strategy="ddp" on 2 CPU processes: one run, written by
rank 0, with the counts of the global batch; the Trainer's own logging is unaffected."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchlens as tl

pytestmark = pytest.mark.slow  # two Lightning processes: about a minute on a shared 2-core machine

SCRIPT = textwrap.dedent(
    """
    import sys, torch, lightning as L
    from torch import nn
    from torchlens.train.callbacks.lightning import TorchlensCallback

    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    if __name__ == "__main__":
        out = sys.argv[1]
        torch.manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        callback = TorchlensCallback(run_dir=out + "/run", backend=None, verbose=False, sample_n=None,
                                     reject_outlier_proportion=0)
        trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=2, strategy="ddp",
                            logger=L.pytorch.loggers.CSVLogger(out, name="csv"), log_every_n_steps=1,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[callback])
        trainer.fit(Regressor(), loader)
        print("RANK", trainer.global_rank, callback.watch.run_dir, flush=True)
    """
)


def test_lightning_ddp_two_cpu_processes_write_one_global_run(tmp_path):
    pytest.importorskip("lightning")
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = sorted(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("RANK"))
    assert ranks == [["0", str(tmp_path / "run")], ["1", "None"]]  # rank 0 writes the one run
    run = tl.open_run(str(tmp_path / "run"))
    steps = run.steps.tolist()
    assert steps == list(range(4))  # 64 samples / 8 per batch / 2 ranks: 4 optimizer steps
    # the model's input on each step: 8 rows x 3 features on each of the 2 ranks
    x = run.series("net:1", "io", "input 0")
    assert (x.counts.sum(axis=1) == 2 * 8 * 3).all()
    g = run.series("net.2:1", "io_grad", "output 0")  # one per-sample norm per row of the global batch
    assert (g.counts.sum(axis=1) == 2 * 8).all()
    # the Trainer's own logging still works
    metrics = next((tmp_path / "csv").rglob("metrics.csv"))
    rows = list(csv.DictReader(open(metrics)))
    assert [r for r in rows if r.get("train_loss")], rows
    assert torch.distributed.is_available()
