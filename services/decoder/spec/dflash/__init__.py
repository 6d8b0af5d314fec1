"""Block drafters conditioned on target hidden states: DFlash, DFlash2 and DSpark.

``config``: the checkpoint's config.json (z-lab's DFlash format, plus a ``dspark_config`` block);
``layers`` and ``heads``: the torch modules; ``model``: the draft network (inference and training
forward); ``checkpoint``: save/load (config.json + model.safetensors); ``drafter``: the engine's
``Drafter`` with a bounded per-request context window.
"""
