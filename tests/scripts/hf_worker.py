"""transformers.Trainer on pushpull (pushpull.huggingface.PushPullTrainer) under pushpull launch or torchrun: a small GPT-2
built from a config (no download) on byte-level text of this repository's own Python files; prints the
held-out loss before and after, and checks that every worker ends with identical parameters."""
import sys
import tempfile
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments
from transformers.utils import logging as hf_logging

import pushpull.torch as bps
from pushpull.huggingface import PushPullTrainer

CONTEXT = 64
ROOT = Path(__file__).resolve().parents[2]


class Windows(torch.utils.data.Dataset):
    def __init__(self, data: bytes, n: int, seed: int):
        self.t = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        g = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(0, len(self.t) - CONTEXT - 1, (n,), generator=g)

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        x = self.t[self.starts[i]:self.starts[i] + CONTEXT]
        return {"input_ids": x, "labels": x}


hf_logging.set_verbosity_error()
torch.set_num_threads(1)
bps.init()
files = sorted((ROOT / "pushpull").rglob("*.py"))
text = b"".join(f.read_bytes() for f in files)
split = int(len(text) * 0.9)
train, held = Windows(text[:split], 2048, 0), Windows(text[split:], 64, 1)
torch.manual_seed(bps.rank())  # different initial weights per worker: the start's broadcast must fix that
model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=CONTEXT, n_embd=64, n_layer=2, n_head=2,
                                   bos_token_id=0, eos_token_id=0))
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=8, per_device_eval_batch_size=16,
                             max_steps=int(sys.argv[1]) if len(sys.argv) > 1 else 60, learning_rate=3e-3,
                             warmup_steps=5, logging_steps=20, save_strategy="no", report_to="none",
                             use_cpu=True, seed=0, disable_tqdm=True, max_grad_norm=1.0)
    trainer = PushPullTrainer(model=model, args=args, train_dataset=train, eval_dataset=held)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    wrapped = type(trainer.model_wrapped).__name__  # DistributedDataParallel where Accelerate ran its own DDP
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
total = bps.push_pull(flat.clone(), average=False, name="hf.check")
same = torch.allclose(total, flat * bps.size(), atol=1e-6)
print(f"HF rank {bps.rank()} of {bps.size()}: eval loss {before:.3f} -> {after:.3f}; identical parameters {same}; "
      f"gradient averages {trainer._pushpull_step}; Accelerate {trainer.accelerator.distributed_type.value}, model "
      f"{wrapped}", flush=True)
bps.shutdown()
