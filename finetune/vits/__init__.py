"""The VITS maths and models: the generator (transformers' VitsModel) and the discriminator, the training
objective with its losses, alignment search and duration loss, bounded inference, speaking text, and
the ONNX export.

May import finetune.data and finetune.system.
"""
