"""finetune: the parts behind prepare_data.py, train_vits.py and train_feedback.py.

Modules are named for what they do; the top-level scripts are recipes that read top to bottom.
"""
