"""Piper's own training step, timed on batches bench/bench_piper.py wrote; run in Piper's environment
(piper-tts[train]), never in ours:

    python peer_piper.py BATCHES.pt OUT.json STEPS BURN_IN HPARAMS_JSON

BATCHES.pt holds micro-batches of real clips as plain tensors (token ids and their lengths, audio in
[-1, 1] and its lengths). Each clip's linear spectrogram is made with Piper's own `spectrogram_torch`, the
clips padded as its `UtteranceCollate` pads them (audio to at least its segment), and the batches fed to
its `VitsModel` (lightning) under a `lightning.Trainer` on the CPU for one epoch: its `training_step` as a
Piper run calls it (generator forward, mel and KL losses, discriminator, both backward passes, both AdamW
steps). A callback times each step from batch start to batch end; OUT.json gets the seconds of the steps
after BURN_IN.
"""

import json
import sys
import time

import lightning as L
import torch
from piper.train.vits.dataset import Batch
from piper.train.vits.lightning import VitsModel
from piper.train.vits.mel_processing import spectrogram_torch


def piper_batch(saved: dict, hparams: dict) -> Batch:
    tokens, token_lengths = saved["tokens"], saved["token_lengths"]
    audio, audio_lengths = saved["audio"], saved["audio_lengths"]
    hop, n_fft = hparams["hop_length"], hparams["filter_length"]
    specs = [
        spectrogram_torch(
            audio[i : i + 1, : audio_lengths[i]], n_fft, hparams["sample_rate"], hop, hparams["win_length"]
        )[0]
        for i in range(len(audio))
    ]
    frames = torch.tensor([s.shape[1] for s in specs], dtype=torch.long)
    padded_specs = torch.zeros(len(specs), specs[0].shape[0], int(frames.max()))
    for i, spec in enumerate(specs):
        padded_specs[i, :, : spec.shape[1]] = spec
    samples = max(int(audio_lengths.max()), hparams["segment_size"])
    padded_audio = torch.zeros(len(audio), 1, samples)
    padded_audio[:, 0, : audio.shape[1]] = audio[:, :samples]
    return Batch(tokens, token_lengths, padded_specs, frames, padded_audio, audio_lengths)


class StepTimer(L.Callback):
    def __init__(self):
        self.seconds: list[float] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.started = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seconds.append(time.perf_counter() - self.started)


def main() -> int:
    batches_path, out_path, steps, burn_in, hparams = sys.argv[1:6]
    steps, burn_in, hparams = int(steps), int(burn_in), json.loads(hparams)
    torch.set_num_threads(int(hparams.pop("threads")))
    saved = torch.load(batches_path)
    batches = [piper_batch(b, hparams) for b in saved]
    batches = [batches[i % len(batches)] for i in range(burn_in + steps)]
    torch.manual_seed(0)
    model = VitsModel(**hparams)
    timer = StepTimer()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[timer],
    )
    loader = torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=lambda batch: batch)
    trainer.fit(model, train_dataloaders=loader)
    generator = sum(p.numel() for p in model.model_g.parameters()) / 1e6
    discriminator = sum(p.numel() for p in model.model_d.parameters()) / 1e6
    result = {"step_s": timer.seconds[burn_in:], "generator_m": generator, "discriminator_m": discriminator}
    with open(out_path, "w", encoding="utf-8") as out:
        json.dump(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
