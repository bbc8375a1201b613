"""What every other part may use: writes that survive crashes and power cuts (atomic), a full disk told
apart from other failures (disk), one run per folder (run_lock), stop requests (interrupt), progress bars
(progress), step-time sections (profile), and where a model comes from (model_source).

Imports nothing else of finetune.
"""
