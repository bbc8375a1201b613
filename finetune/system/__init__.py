"""What every other part may use: writes that survive crashes and power cuts (atomic), a full disk told
apart from other failures (disk), one run per folder (run_lock), stop requests (interrupt), progress bars
(progress), step-time sections (profile), where a model comes from (model_source), and a CPU run's
thread count on a machine others share (cpu_threads).

Imports nothing else of finetune.
"""
