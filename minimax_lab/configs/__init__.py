"""Launch configs of the package's Triton kernels, one JSON file per GPU.

Every kernel asks :func:`launch_config` for its launch config:

* under the Triton interpreter (CPU): the kernel's small interpreter config;
* on a GPU: the entry tuned for this GPU in ``<config dir>/<gpu slug>.json`` (written by
  ``python -m minimax_lab.bench.tune <op>``), else the built-in default -- the values tuned on the
  H200, shipped as ``minimax_lab/configs/NVIDIA_H200.json``.

A caller's ``config`` overrides keys of that base, one rule everywhere:
``{**base, **(config or {})}``; a key the op does not know raises ValueError naming the allowed
keys. The config dir is this package folder unless ``MINIMAX_LAB_CONFIG_DIR`` names another.

File layout: ``{"device": ..., "ops": {op: {"source": ..., "config": {...}}}}``; an op tuned per
shape regime (``moe_experts``) holds ``"by_key": {key: {...}}`` instead of ``"config"``.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from minimax_lab import runtime

ENV_DIR = "MINIMAX_LAB_CONFIG_DIR"
PACKAGE_DIR = Path(__file__).resolve().parent
#: built-in defaults: the configs tuned on the H200
DEFAULT_FILE = PACKAGE_DIR / "NVIDIA_H200.json"

_MOE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "SWAP_AB", "DOWN_BLOCK_N",
             "DOWN_BLOCK_K", "DOWN_num_warps", "DOWN_num_stages", "DOWN_SWAP_AB", "GROUP_M", "USE_TMA",
             "DOWN_GROUP_M", "DOWN_USE_TMA")
#: every op and the config keys it takes
OPS: dict[str, tuple[str, ...]] = {
    "paged_decode": ("BLOCK_N", "num_warps", "num_stages", "programs_per_sm"),
    "paged_prefill": ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"),
    "flash": ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "USE_TMA", "GROUP_H", "WARP_SPEC"),
    "msa_index": ("PAGES", "num_warps", "num_stages"),
    "msa_prefill": ("BLOCK_M", "TOKENS_PER_PROG", "num_warps", "num_stages", "L2_TOKENS", "COMBINE_WARPS",
                    "Q_WARPS", "Q_STAGES"),
    "msa_select": ("BLOCK_M", "num_warps", "num_stages"),
    "msa_select_fp8": ("BLOCK_M", "num_warps", "num_stages"),
    "moe_experts": _MOE_KEYS + ("SLOT_BLOCKS_MAX",),
    "moe_experts_fp8": _MOE_KEYS + ("FP32_PROMOTE", "FP8_UPCAST"),
}


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {sorted(OPS)}")


def config_dir() -> Path:
    """Where tuned files are read and written: ``$MINIMAX_LAB_CONFIG_DIR`` or this package folder."""
    env = os.environ.get(ENV_DIR, "").strip()
    return Path(env) if env else PACKAGE_DIR


@functools.lru_cache(maxsize=None)
def device_slug() -> str:
    """This device's file-name slug (:func:`minimax_lab.runtime.device_slug`), computed once."""
    return runtime.device_slug()


def config_path(slug: str | None = None) -> Path:
    """The tuned-config file of a device (default: this one)."""
    return Path(_path_str(os.environ.get(ENV_DIR, "").strip(), slug or device_slug()))


@functools.lru_cache(maxsize=64)
def _read_cached(path: str, mtime_ns: int) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("ops"), dict):
        raise ValueError(f"{path}: expected an object with an 'ops' object, got {type(data).__name__}")
    return data


def read_file(path: Path | str) -> dict | None:
    """A config file's content (``None`` if there is none); cached until the file changes."""
    path = Path(path)
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
    return _read_cached(str(path), mtime)


def lookup(data: dict | None, op: str, key: str | None = None, *, where: str = "") -> dict | None:
    """``op``'s config (for ``key``, where the op is tuned per key) from a file's content."""
    entry = (data or {}).get("ops", {}).get(op)
    if entry is None:
        return None
    if "by_key" in entry:
        cfg = entry["by_key"].get(key)
    else:
        cfg = entry.get("config")
    if cfg is None:
        return None
    unknown = sorted(set(cfg) - set(OPS[op]))
    if unknown:
        raise ValueError(f"{where}: {op} has unknown config keys {unknown}; allowed: {sorted(OPS[op])}")
    return dict(cfg)


def builtin(op: str, key: str | None = None) -> dict:
    """The built-in default config of ``op`` (the H200's)."""
    _check_op(op)
    cfg = lookup(read_file(DEFAULT_FILE), op, key, where=str(DEFAULT_FILE))
    if cfg is None:
        raise KeyError(f"{DEFAULT_FILE.name} has no config for {op!r}" + (f" key {key!r}" if key else ""))
    return cfg


def tuned(op: str, key: str | None = None, *, slug: str | None = None) -> dict | None:
    """``op``'s config tuned for this GPU (or the device ``slug``), ``None`` if none was tuned."""
    _check_op(op)
    path = config_path(slug)
    return lookup(read_file(path), op, key, where=str(path))


def interpreting() -> bool:
    return runtime.is_interpreter()


def merge(op: str, base: dict, config: dict | None) -> dict:
    """The one merge rule: ``{**base, **(config or {})}``; unknown keys raise ValueError."""
    _check_op(op)
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"{op}: config must be a dict or None, got {type(config).__name__}")
    unknown = sorted(set(config or {}) - set(OPS[op]))
    if unknown:
        raise ValueError(f"{op}: unknown config keys {unknown}; allowed: {sorted(OPS[op])}")
    return {**base, **(config or {})}


def launch_config(op: str, *, interpreter: dict, key: str | None = None, config: dict | None = None) -> dict:
    """The launch config of ``op``: ``interpreter`` under the interpreter, else this GPU's tuned
    config, else the built-in default; ``config`` overrides keys of it (see the module docstring).
    ``key`` picks the entry of an op tuned per key (``moe_experts``: the shape regime)."""
    if interpreting():
        return merge(op, dict(interpreter), config)
    # called on every kernel launch: one stat per file instead of re-reading paths and entries
    # (16 -> 4.4 µs per call on a CPU of the CI machine); a rewritten file has a new mtime
    path = _path_str(os.environ.get(ENV_DIR, "").strip(), device_slug())
    default_mtime = None if path == _DEFAULT_STR else _mtime(_DEFAULT_STR)
    return merge(op, _gpu_base(path, _mtime(path), default_mtime, op, key), config)


_DEFAULT_STR = str(DEFAULT_FILE)


@functools.lru_cache(maxsize=16)
def _path_str(dir_env: str, slug: str) -> str:
    """The file of device ``slug`` in :func:`config_dir` (``dir_env``: ``$MINIMAX_LAB_CONFIG_DIR``)."""
    return str((Path(dir_env) if dir_env else PACKAGE_DIR) / f"{slug}.json")


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None


@functools.lru_cache(maxsize=256)
def _gpu_base(path: str, mtime: int | None, default_mtime: int | None, op: str, key: str | None) -> dict:
    """``tuned`` else ``builtin`` for the files as they are at these mtimes (the cache key; the
    result is never mutated: :func:`merge` copies it)."""
    _check_op(op)
    cfg = lookup(_read_cached(path, mtime), op, key, where=path) if mtime is not None else None
    return cfg if cfg is not None else builtin(op, key)
