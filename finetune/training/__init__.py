"""The run's machinery. The loop (loop: its phases) and the parts it is made of: one window of micro-batches
(window) through one optimizer step (step; late: a micro-batch given up at the deadline), the discriminator's
warm-up (warmup), the batch fitted to memory (batch_fit), the run's evaluations (run_evaluations) and which
one's model is kept (selection), checkpoints (checkpoint_writer; checkpoint_file: the file format), model
folders (model_folders, saving), going back after failures (recovery), the finish inside the time left
(finishing) and what a run hands back (outcome). Around them: the time budget (budget, pacing), the
learning-rate curve (schedule), the settings (run_settings), number format (precision) and state (state) of a
run, the means every part shares (context), data-parallel processes (distributed), building a run's parts
(assembly, machinery). The evaluator it is given: run_evaluations' RunEvaluator.

May import every other sub-package; none of them imports this one.
"""
