"""Drafter training: self-distillation data, target features, the training loop (``train-drafter``)."""
