"""Corrections: what a round of train_feedback.py is, in one package.

    corrections.py      the user's corrected recordings, prepared like the corpus; the replay sample; which
                        corrections are held out to decide (by sentence, the same ones in every round of a voice)
    round_evaluator.py  what a round is judged on at each evaluation (FeedbackEvaluator: the shared loop takes it
                        through finetune/training/run_evaluations.py's RunEvaluator)
    decision.py         whether the round's model is kept (decide)
    report.py           the round's readable report
    versions.py         the voice's versions folder: current/, v000/, v001/ ..., history.json, rollback
    recipe.py           train_feedback.py's steps: the round's folder, data, starting point, loop, decision

A feature above every layer: it may import all of finetune (training, reporting, vits, data, system, and the
recipes' shared wiring); nothing in finetune imports it (tests/test_layers.py holds both).
"""
