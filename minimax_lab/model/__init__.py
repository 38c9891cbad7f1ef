"""The tiny early-fusion multimodal model (notebook 01), reused by the MSA, MoE and KV-cache chapters.

* :mod:`.config` -- ``ModelConfig`` and ``preset_config``
* :mod:`.layers` -- RMSNorm, RoPE, patch embedding, SwiGLU, attention probabilities
* :mod:`.model` -- ``TinyMultimodalModel`` with the step API
* :mod:`.train` -- training loop, evaluation, checkpoints, ``load_pretrained``
* :mod:`.experiments` -- grounding ratio, step-zero vs text-first
"""
from minimax_lab.model.config import ModelConfig, preset_config
from minimax_lab.model.model import Block, TinyMultimodalModel
from minimax_lab.model.train import (TrainConfig, accuracy, evaluate, load_checkpoint, load_pretrained,
                                     save_checkpoint, train)

__all__ = ["ModelConfig", "preset_config", "Block", "TinyMultimodalModel", "TrainConfig", "accuracy", "evaluate",
           "load_checkpoint", "load_pretrained", "save_checkpoint", "train"]
