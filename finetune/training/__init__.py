"""The run's machinery: the time budget (budget, pacing), the loop, its milestones and its ending, one
optimizer step (step), the discriminator's warm-up, going back after failures (recovery), checkpoints and saving,
data-parallel processes (distributed), assembling a run (session), and feedback rounds (feedback).

May import every other sub-package; none of them imports this one.
"""
