"""The tiny early-fusion multimodal model (notebook 01), reused by the MSA, MoE and KV-cache chapters.

* :mod:`.config` -- ``ModelConfig`` and ``preset_config``
* :mod:`.layers` -- RMSNorm, RoPE, patch embedding, SwiGLU, attention probabilities
* :mod:`.model` -- ``TinyMultimodalModel`` with the step API
* :mod:`.train` -- training loop, evaluation, checkpoints, ``load_pretrained``
* :mod:`.experiments` -- grounding ratio, step-zero vs text-first
* :mod:`.make_checkpoint` -- trains the shipped ``minimax_lab/assets/tiny_cpu.pt`` (``python -m ...``)
* :mod:`.sweep` -- a parallel sweep of training configs

Hooks used by other chapters: ``ModelConfig(attention=..., attn_impl=...)`` picks the attention
algorithm ("dense" or "msa") and its implementation ("reference", "torch", "triton");
``ModelConfig(use_indexer=True)`` adds the MSA index projections (``Block.index_qk``) that
``attention="msa"`` needs; ``ModelConfig(ffn="moe")`` swaps the SwiGLU FFN for
``minimax_lab.moe.MoEFFN``; the step API (``embed`` / ``qkv`` / ``finish`` / ``logits``) lets an
engine run the layers itself. ``load_pretrained(**overrides)`` loads the shipped checkpoint.
"""
from minimax_lab.model.config import ModelConfig, preset_config
from minimax_lab.model.model import Block, TinyMultimodalModel
from minimax_lab.model.train import (TrainConfig, accuracy, evaluate, load_checkpoint, load_pretrained,
                                     preset_train_config, save_checkpoint, train)

__all__ = ["ModelConfig", "preset_config", "Block", "TinyMultimodalModel", "TrainConfig", "accuracy", "evaluate",
           "load_checkpoint", "load_pretrained", "preset_train_config", "save_checkpoint", "train"]
