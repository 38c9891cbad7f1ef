"""Exercises of chapter 01 (Multimodal from step zero): the bookkeeping of one sequence that holds
image patches and words.

* 01.1 the loss mask: which positions predict a word (never an image patch or padding);
* 01.2 unpatchify: turn patch tokens back into images (the inverse of the patch embedding's cut);
* 01.3 image segments: which image each position belongs to, and where in its image;
* 01.4 the interleaved attention mask: causal for words, both ways inside an image;
* 01.5 RMSNorm in Triton: the learner's own kernel, one program per row, fp32 sums, strided rows.

Each checker draws fresh random sequences or images on every call and compares with the package's
own layout (:func:`minimax_lab.data.collate`, :class:`minimax_lab.model.layers.PatchEmbed`); 01.5
compares with RMSNorm computed in fp32 from its formula, and its answer may not call the package's
:class:`~minimax_lab.model.layers.RMSNorm` nor have PyTorch compute the norm around the kernel.
"""
from __future__ import annotations

import random

import torch

from minimax_lab.exercises import exercise, fresh_rng, on_kernel_device, tensor_problem
from minimax_lab.model.layers import PatchEmbed, RMSNorm

IMG, PAD = 7, 0   # token ids the checkers use for <img> and <pad> (the real ones come from the tokenizer)


def _sequence(rng: random.Random, patches_per_image: int, *, min_images: int = 0) -> torch.Tensor:
    """A random interleaved sequence: text runs (ids 1..40, never IMG) and whole images of
    ``patches_per_image`` IMG tokens, some back to back."""
    toks = [1]  # <bos>
    n_images = rng.randint(min_images, 3)
    for i in range(n_images):
        toks += [rng.choice([t for t in range(1, 41) if t != IMG]) for _ in range(rng.choice([0, 0, 1, 3, 6]))]
        toks += [IMG] * patches_per_image
    toks += [rng.choice([t for t in range(1, 41) if t != IMG]) for _ in range(rng.randint(1, 8))]
    return torch.tensor(toks)


def _first_difference(got: torch.Tensor, want: torch.Tensor) -> str:
    idx = (got != want).nonzero()[0].tolist()
    return f"first difference at {tuple(idx)}: expected {want[tuple(idx)].item()}, got {got[tuple(idx)].item()}"


# --------------------------------------------------------------------------- 01.1 the loss mask


def loss_mask(tokens: torch.Tensor, img_id: int, pad_id: int) -> torch.Tensor:
    """``tokens [B, S]``: interleaved sequences (words, ``img_id`` placeholders for image patches,
    right padding with ``pad_id``). Position ``t`` is trained to predict ``tokens[:, t + 1]``.
    Return a bool tensor ``[B, S]``: True where that next token is a word (``<eos>`` included), so
    its loss counts; False where it is an image placeholder or padding, and at the last position
    (nothing follows)."""
    raise NotImplementedError  # your code here


@exercise("01.1", "the loss mask", "Mark the positions whose next token is a word: the model is never "
          "trained to predict an image placeholder or padding.", loss_mask)
def _check_loss_mask(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    for trial in range(4):
        seqs = [_sequence(rng, rng.choice([1, 4, 16])) for _ in range(rng.randint(1, 4))]
        S = max(len(s) for s in seqs) + rng.randint(0, 3)
        tokens = torch.full((len(seqs), S), PAD)
        for i, s in enumerate(seqs):
            tokens[i, :len(s)] = s
        targets = torch.full_like(tokens, PAD)
        targets[:, :-1] = tokens[:, 1:]
        want = (targets != PAD) & (targets != IMG)        # as minimax_lab.data.collate builds it
        got = fn(tokens.clone(), IMG, PAD)
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool or got.shape != want.shape:
            problems.append(f"expected a bool tensor of shape {tuple(want.shape)}; got "
                            f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}")
            break
        if not torch.equal(got.cpu(), want):
            row = int((got.cpu() != want).nonzero()[0, 0])
            problems.append(f"row {row}, tokens {tokens[row].tolist()} (img_id={IMG}, pad_id={PAD}): "
                            f"{_first_difference(got.cpu(), want)} ({int(want[row].sum())} positions should count)")
            break
    return problems


# --------------------------------------------------------------------------- 01.2 unpatchify


def _patchify(images: torch.Tensor, p: int) -> torch.Tensor:
    """The patch embedding's cut (:class:`minimax_lab.model.layers.PatchEmbed`), for any H, W."""
    N, C, H, W = images.shape
    gh, gw = H // p, W // p
    return images.reshape(N, C, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(N, gh * gw, C * p * p)


def unpatchify(patches: torch.Tensor, H: int, W: int, patch: int) -> torch.Tensor:
    """The inverse of the patch embedding's cut. ``patches [N, P, C*patch*patch]`` holds, for each
    of ``N`` images of ``H x W`` pixels, its ``P = (H/patch) * (W/patch)`` patches in raster order
    (left to right, then top to bottom); each patch is flattened channel first, then row, then
    column (``C, patch, patch``). Return the images ``[N, C, H, W]``."""
    raise NotImplementedError  # your code here (a reshape, a permute, a reshape)


@exercise("01.2", "unpatchify", "Turn patch tokens back into images: the inverse of the cut the patch "
          "embedding makes.", unpatchify)
def _check_unpatchify(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    embed = PatchEmbed(32, 8, 4)  # the package's cut must be the one the exercise inverts
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        embed.proj.weight.copy_(torch.eye(4, 3 * 64)), embed.proj.bias.zero_()
        embed.row.weight.zero_(), embed.col.weight.zero_()
        assert torch.equal(embed(x), _patchify(x, 8)[..., :4])
    for _ in range(5):
        p, C = rng.choice([2, 4, 8]), rng.choice([1, 3])
        gh, gw = rng.randint(2, 5), rng.randint(2, 5)
        N = rng.randint(1, 3)
        images = torch.rand(N, C, gh * p, gw * p)
        got = fn(_patchify(images, p).clone(), gh * p, gw * p, p)
        call = f"unpatchify of {N} image(s) of {C}x{gh * p}x{gw * p} in {p}x{p} patches"
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(images.shape):
            problems.append(f"{call}: expected shape {tuple(images.shape)}, got {tuple(getattr(got, 'shape', ()))}")
            break
        if not torch.equal(got, images):
            wrong = (got != images).any(1).float().mean().item()
            problems.append(f"{call}: {wrong:.0%} of the pixels land in the wrong place")
            break
    return problems


# --------------------------------------------------------------------------- 01.3 image segments


def image_segments(tokens: torch.Tensor, img_id: int, patches_per_image: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens [S]``: one interleaved sequence in which every image is ``patches_per_image``
    consecutive ``img_id`` tokens (two images may follow each other directly). Return
    ``(segment, patch_index)``, two int64 tensors ``[S]``: ``segment`` is 0 for a word and ``k``
    for the patches of the ``k``-th image (1, 2, ...); ``patch_index`` is the patch's place in its
    image (0 .. patches_per_image - 1, raster order) and -1 for a word."""
    raise NotImplementedError  # your code here


def _segments(tokens: torch.Tensor, P: int) -> tuple[torch.Tensor, torch.Tensor]:
    is_img = tokens == IMG
    k = torch.cumsum(is_img.long(), 0) - 1                      # how many patches came before, this one included
    segment = torch.where(is_img, k // P + 1, torch.zeros_like(k))
    patch_index = torch.where(is_img, k % P, torch.full_like(k, -1))
    return segment, patch_index


@exercise("01.3", "image segments", "Say which image each position belongs to and where in that image, "
          "images back to back included.", image_segments, answers=(_segments,))
def _check_image_segments(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    for _ in range(6):
        P = rng.choice([1, 4, 9, 16])
        tokens = _sequence(rng, P, min_images=2)
        want_seg, want_idx = _segments(tokens, P)
        got = fn(tokens.clone(), IMG, P)
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            problems.append(f"expected a pair of tensors (segment, patch_index); got {type(got).__name__}")
            break
        seg, idx = (t.cpu().long() for t in got)
        for name, g, w in (("segment", seg, want_seg), ("patch_index", idx, want_idx)):
            if g.shape != w.shape:
                problems.append(f"{name}: expected shape {tuple(w.shape)}, got {tuple(g.shape)}")
            elif not torch.equal(g, w):
                problems.append(f"{name} for tokens {tokens.tolist()} (patches_per_image={P}): "
                                f"{_first_difference(g, w)}")
        if problems:
            break
    return problems


# --------------------------------------------------------------------------- 01.4 the interleaved mask


def interleaved_mask(segment: torch.Tensor) -> torch.Tensor:
    """``segment [S]`` as in 01.3 (0 for a word, k for the patches of the k-th image). Return a bool
    tensor ``[S, S]``, True where query position ``i`` may attend to key position ``j``: every
    position sees itself and everything before it (causal), and the patches of one image also see
    each other in both directions (a patch may look at a later patch of its own image)."""
    raise NotImplementedError  # your code here


@exercise("01.4", "the interleaved attention mask", "Build the mask of an interleaved sequence: causal "
          "across it, both ways inside each image.", interleaved_mask)
def _check_interleaved_mask(fn) -> list[str]:
    rng, problems = fresh_rng(), []
    for _ in range(6):
        P = rng.choice([4, 9, 16])
        seg, _ = _segments(_sequence(rng, P, min_images=1), P)
        S = len(seg)
        causal = torch.ones(S, S, dtype=torch.bool).tril()
        want = causal | ((seg[:, None] == seg[None, :]) & (seg[:, None] > 0))
        got = fn(seg.clone())
        if not isinstance(got, torch.Tensor) or got.dtype != torch.bool or tuple(got.shape) != (S, S):
            problems.append(f"expected a bool tensor of shape ({S}, {S}); got "
                            f"{getattr(got, 'dtype', type(got).__name__)} {tuple(getattr(got, 'shape', ()))}")
            break
        got = got.cpu()
        if not torch.equal(got, want):
            i, j = (got != want).nonzero()[0].tolist()
            what = ("a word (or another image) must not see a later position" if not want[i, j] else
                    "patches of one image see each other" if seg[i] == seg[j] and seg[i] > 0 else
                    "every position sees itself and the positions before it")
            problems.append(f"segment {seg.tolist()}: at query {i}, key {j} expected {bool(want[i, j])}, "
                            f"got {bool(got[i, j])} ({what})")
            break
    return problems


# --------------------------------------------------------------------------- 01.5 RMSNorm in Triton


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of each row of ``x [B, S, D]`` times ``weight [D]``, ``x[b, s] / sqrt(mean(x[b, s]²) + eps)
    * weight``, computed by a ``@triton.jit`` kernel that you write above this function and launch
    here, one program per row (a grid of ``B x S`` programs). ``x`` is fp32 or fp16 on
    ``runtime.kernel_device()``; return a new tensor of its shape and dtype. ``x`` may be a view cut
    out of a larger tensor: row ``(b, s)`` starts ``b * x.stride(0) + s * x.stride(1)`` elements in,
    and its ``D`` elements are contiguous. ``D`` is rarely a power of two: load the row as one tile of
    ``triton.next_power_of_2(D)`` lanes, masked, and divide by ``D``. Square and sum in fp32 (the
    square of an fp16 value above 256 overflows fp16); cast to ``x``'s dtype only when storing."""
    raise NotImplementedError  # your code here


def _rms_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm times the weight, read off the formula, in fp32 whatever ``x``'s dtype."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


#: per-element tolerance ``(rtol, atol)`` against the fp32 reference: fp32 differs only in the order of
#: the sum; an fp16 result is rounded once (half an fp16 step is 4.9e-4 of the value)
RMS_TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3)}


def _rms_inputs(rng: random.Random, g: torch.Generator, dtype: torch.dtype, zero_row: bool):
    """``(x, weight, eps, outliers, zero)``: ``x [B, S, D]`` a view into a NaN-filled buffer whose
    rows are wider than ``D`` by more than a tile's overhang, with a NaN row after each batch (so
    the rows lie more than ``D`` apart and the batches more than ``S`` rows apart); each row has
    its own scale. ``outliers``: the rows holding a value of a few hundred (fp16 only, where its
    square overflows); ``zero``: the all-zero row, or None."""
    B, S = rng.randint(2, 3), rng.randint(2, 5)
    D = rng.randint(20, 90) | 1                                   # odd: the tile always overhangs the row
    width = (1 << (D - 1).bit_length()) + rng.randint(1, 8)
    buf = torch.full((B, S + 1, width), float("nan"))
    x = buf[:, :S, :D]
    x.copy_(torch.randn(B, S, D, generator=g) * torch.empty(B, S, 1).uniform_(0.3, 4.0, generator=g))
    outliers = []
    if dtype == torch.float16:
        for b in range(B):
            for s in range(S):
                if (b + s) % 2 == 0:
                    sign = 1 if rng.random() < 0.5 else -1
                    x[b, s, rng.randrange(D)] = sign * rng.uniform(300.0, 600.0)
                    outliers.append((b, s))
    zero = (rng.randrange(1, B), rng.randrange(S)) if zero_row else None
    if zero is not None:
        x[zero] = 0.0
    weight = (torch.randn(D, generator=g) * 0.5 + 1.0).to(dtype)
    return buf.to(dtype)[:, :S, :D], weight, rng.choice([1e-6, 1e-5]), outliers, zero


def _rms_as_if(x: torch.Tensor, stride: tuple, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference on the rows a kernel reads when it walks ``x``'s memory with ``stride``."""
    return _rms_reference(x.as_strided(x.shape, stride, x.storage_offset()), weight, eps)


def _rms_hint(got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
              eps: float, outliers: list, zero) -> str:
    """Why the rows marked in ``bad [B, S]`` differ, in the learner's terms: each suspected mistake is
    recomputed (the same norm on the rows it would read, or with the mean it would take) and named
    when it gives the learner's numbers."""
    B, S, D = x.shape
    rtol, atol = RMS_TOLERANCE[x.dtype]

    def gives(alt: torch.Tensor) -> bool:
        return torch.allclose(got, alt, rtol=rtol, atol=atol, equal_nan=True)

    if zero is not None and bad[zero] and not torch.isfinite(got[zero]).all():
        return (f"row {zero} is all zeros and yours holds NaN there: add eps inside the square root, "
                f"sqrt(mean(x²) + eps), so a zero row stays zero")
    if gives(_rms_as_if(x, (S * D, D, 1), weight, eps)):
        return (f"your kernel read the rows as if x were contiguous (D = {D} elements apart): row (b, s) starts "
                f"b * x.stride(0) + s * x.stride(1) elements in, and here x.stride(1) = {x.stride(1)}")
    if gives(_rms_as_if(x, (S * x.stride(1), x.stride(1), 1), weight, eps)):
        return (f"your kernel found batch b at b * S * x.stride(1): batch b starts b * x.stride(0) elements in "
                f"(here x.stride(0) = {x.stride(0)}, not {S * x.stride(1)})")
    if not torch.isfinite(got).all():
        b, s = (int(i) for i in (~torch.isfinite(got).all(-1)).nonzero()[0])
        return (f"row ({b}, {s}) holds NaN: your kernel read past the row's {D} elements (the memory after each row "
                f"holds NaN here): mask the load with cols < D and give the masked lanes other=0.0, so that they "
                f"add nothing to the sum")
    hit = [r for r in outliers if bad[r]]
    if hit:
        b, s = hit[0]
        big = float(x[b, s].float().abs().max())
        return (f"row ({b}, {s}) holds {big:.0f}, whose square ({big * big:,.0f}) is larger than fp16 can hold "
                f"(65,504): convert the loaded row with .to(tl.float32) before squaring and summing, and cast back "
                f"only when storing")
    tile = 1 << (D - 1).bit_length()
    xf = x.float()
    if gives(xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / tile + eps) * weight.float()):
        return (f"you divided the sum of squares by the tile's {tile} lanes: the mean is over the row's D = {D} "
                f"elements (the masked lanes are not part of the row)")
    if gives(xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True)) * weight.float()):
        return f"add eps inside the square root, sqrt(mean(x²) + eps) (here eps = {eps:g})"
    b, s = (int(i) for i in bad.nonzero()[0])
    j = int((got[b, s] - want[b, s]).abs().argmax())
    return (f"row ({b}, {s}) differs most at element {j}: {float(got[b, s, j]):.5g}, expected "
            f"{float(want[b, s, j]):.5g}")


@exercise("01.5", "RMSNorm in Triton", "Write RMSNorm as a Triton kernel, one program per row: the mean of the "
          "squares summed in fp32, a masked tile for a ragged width, and each row found through the strides.",
          rms_norm_rows, writes_triton=True, answers=(_rms_reference, RMSNorm))
def _check_rms_norm_rows(fn) -> list[str]:
    rng = fresh_rng()
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    for dtype, zero_row in ((torch.float32, False), (torch.float32, True), (torch.float16, False)):
        x, weight, eps, outliers, zero = _rms_inputs(rng, g, dtype, zero_row)
        B, S, D = x.shape
        call = (f"rms_norm_rows(x [{B}, {S}, {D}] {str(dtype).replace('torch.', '')} (strides {x.stride()}), "
                f"weight [{D}], eps={eps:g})")
        want = _rms_reference(x, weight, eps)
        got = fn(on_kernel_device(x), on_kernel_device(weight), eps)
        wrong = tensor_problem(got, call, (B, S, D), dtype)
        if wrong:
            return [wrong]
        got = got.detach().float().cpu()
        rtol, atol = RMS_TOLERANCE[dtype]
        close = (got - want).abs() <= atol + rtol * want.abs()
        bad = ~close.all(-1)
        if bad.any():
            return [f"{call}: {int(bad.sum())} of {B * S} rows differ from RMSNorm computed in fp32 (tolerance "
                    f"rtol {rtol:g}, atol {atol:g}): " + _rms_hint(got, want, bad, x, weight, eps, outliers, zero)]
    return []
