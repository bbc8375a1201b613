"""The run's machinery. The loop (loop: its phases) and the parts it is made of: one window of
micro-batches (window) through one optimizer step (step), the discriminator's warm-up (warmup), the batch
fitted to memory (batch_fit), evaluations and the best model (evaluating), checkpoints (checkpointing,
checkpoint: the file format), model folders (exports, saving), going back after failures (recovery), how a
run ends (ending). Around them: the time budget (budget, pacing), the settings (run_settings) and state
(state) of a run, the means every part shares (context), data-parallel processes (distributed), building
a run's parts (session). How a run finishes inside its budget: finishing. The evaluator it is given: evaluating's
RunEvaluator.

May import every other sub-package; none of them imports this one.
"""
