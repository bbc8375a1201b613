"""What every other part may use: writes that survive crashes (atomic), stop requests (interrupt),
progress bars (progress), step-time sections (profile), and where a model comes from (model_source).

Imports nothing else of finetune.
"""
