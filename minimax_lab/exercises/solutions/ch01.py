"""Solutions of chapter 01's exercises (one function per exercise, named like its stub)."""
from __future__ import annotations

import torch


def loss_mask(tokens: torch.Tensor, img_id: int, pad_id: int) -> torch.Tensor:
    nxt = torch.full_like(tokens, pad_id)
    nxt[:, :-1] = tokens[:, 1:]                     # the token each position predicts
    return (nxt != pad_id) & (nxt != img_id)


def unpatchify(patches: torch.Tensor, H: int, W: int, patch: int) -> torch.Tensor:
    N, _, CPP = patches.shape
    p, gh, gw = patch, H // patch, W // patch
    C = CPP // (p * p)
    x = patches.reshape(N, gh, gw, C, p, p)         # [N, grid row, grid col, C, pixel row, pixel col]
    return x.permute(0, 3, 1, 4, 2, 5).reshape(N, C, H, W)


def image_segments(tokens: torch.Tensor, img_id: int, patches_per_image: int) -> tuple[torch.Tensor, torch.Tensor]:
    is_img = tokens == img_id
    k = torch.cumsum(is_img.long(), 0) - 1          # index of each patch among all the sequence's patches
    segment = torch.where(is_img, k // patches_per_image + 1, torch.zeros_like(k))
    patch_index = torch.where(is_img, k % patches_per_image, torch.full_like(k, -1))
    return segment, patch_index


def interleaved_mask(segment: torch.Tensor) -> torch.Tensor:
    S = segment.shape[0]
    causal = torch.ones(S, S, dtype=torch.bool, device=segment.device).tril()
    same_image = (segment[:, None] == segment[None, :]) & (segment[:, None] > 0)
    return causal | same_image
