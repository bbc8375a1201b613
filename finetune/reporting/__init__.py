"""What a run tells its user, and how it judges a voice: the log and metrics.jsonl (logs), the run's one
place for all of it (run_log), evaluation on held-out clips and its measures (evaluation, measures),
report.html with its plots, TensorBoard / W&B (tracking).

May import finetune.vits, finetune.data and finetune.system.
"""
