"""finetune: the parts behind the recipes (prepare_data.py, train_vits.py, train_feedback.py, synthesize.py,
export_onnx.py), in five sub-packages along the real seams and a feature's own package (feedback). Imports
point one way, down this list:

    feedback/  a feature above the layers: corrections, a round's evaluator and decision, versions,
               train_feedback.py's steps (it may import all of the below; nothing imports it)
    recipes/   what each recipe script builds its run from: shared.py (the wiring both training recipes
               share: run folder, device, step, log, loop), train.py (train_vits.py's steps)
    cli.py     flags from a config dataclass (each flag's resume rule with it); settings.py: the training
               flags both training recipes share. Light: a script reads its flags before torch is imported
    training/  the run's machinery: budget and pacing, the loop and one optimizer step, warm-up,
               recovery, checkpoints and saving, torchrun
    reporting/ what the run tells its user, and how it judges a voice: logs, metrics, evaluation and
               its measures, report.html, plots, TensorBoard
    vits/      the VITS maths and models: generator, discriminator, objective, losses, alignment,
               duration loss, bounded inference, synthesis, ONNX export
    data/      the data path: sources, preparation, audio, text, the corpus in RAM, spectrogram
               features, the bucketed sampler, micro-batch feeding
    system/    what any part may use: durable writes, stop requests, progress bars, step-time sections,
               where a model comes from (hub, folder, scratch)

Where to start reading: train_vits.py, then recipes/train.py, then training/loop.py.
"""
