"""What each recipe script builds its run from, so that the scripts at the top read as recipes: their flags,
then one call a step (run folder, model, data, loop, fit, report).

    shared.py    the wiring train_vits.py and train_feedback.py share: a run's place and means (folder, log,
                 metrics, budget, device, precision), the features a model needs, the training loop built
                 from what a recipe brings
    train.py     train_vits.py's steps: the run folder and what it resumes, the model and its speakers, the
                 corpus in RAM, the loop with its evaluation, the closing lines

train_feedback.py's steps are finetune/feedback/recipe.py, in the feature's own package.

The top layer of finetune/: it may import every sub-package below it (training, reporting, vits, data,
system) and finetune.cli / finetune.settings; nothing below imports it (finetune/feedback/, above it, does).
The scripts import it inside the function that runs the job, after their flags are read, so that `--help` and
a flag error never wait for torch.
"""
