"""Launch configs of the package's Triton kernels: a launch block beside each kernel, values per GPU.

Each Triton file holds, right above the kernel it configures, one :class:`Launch` per op: the
op's name, the config keys it takes, its interpreter config, the tuner's candidates (per key for
an op tuned per shape regime), the variant ``--quick`` tries, and an estimate of the shared
memory each of its kernels needs. The values for GPUs live in JSON files in this folder:

* ``<gpu slug>.json`` -- the configs tuned on one GPU (``python -m minimax_lab.bench.tune <op>``
  writes them; ``NVIDIA_H200.json`` ships);
* ``sm_75.json``, ``sm_80.json``, ``sm_89.json``, ``sm_90.json`` -- the default of each
  architecture family, sized to fit its shared memory per block (:data:`FAMILIES`).

:func:`launch_config` answers, in order: under the interpreter, the block's interpreter config; on
a GPU, the entry for this GPU in the config dir (``$MINIMAX_LAB_CONFIG_DIR``, else this folder),
then in this folder, then in the default of the GPU's family (:func:`family`). A caller's
``config`` overrides keys of that base, one rule everywhere: ``{**base, **(config or {})}``; a key
the op does not take raises ``ValueError`` naming the allowed keys.

File layout: ``{"device": ..., "ops": {op: {"source": <the tuner run that produced it>,
"config": {...}}}}``; an op tuned per key holds ``"by_key": {key: {...}}`` instead of
``"config"``, and its ``"source"`` is ``{key: <run>}``.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

from minimax_lab import runtime

ENV_DIR = "MINIMAX_LAB_CONFIG_DIR"
PACKAGE_DIR = Path(__file__).resolve().parent

#: the default family files, newest first: (name, the oldest compute capability of the family, the
#: shared memory per block its configs are sized for). A GPU takes the newest family whose
#: capability and shared memory it has (an sm_86 with ~99 KB takes sm_75's, an sm_120 sm_89's).
FAMILIES: tuple[tuple[str, tuple[int, int], int], ...] = (
    ("sm_90", (9, 0), 232448),   # Hopper: 227 KB
    ("sm_89", (8, 9), 101376),   # Ada: 99 KB
    ("sm_80", (8, 0), 166912),   # A100: 163 KB
    ("sm_75", (7, 5), 65536),    # Turing: 64 KB
)

#: shared-memory estimate of one kernel's program from its launch arguments by name (tensors,
#: constexprs, ``num_warps``, ``num_stages``), in bytes
SmemEstimate = Callable[[Mapping[str, Any]], int]


@dataclass(frozen=True, eq=False)
class Launch:
    """One op's launch block: ``op`` (its name in the config files), ``keys`` (the config keys it
    takes), ``interpreter`` (its config under Triton's interpreter), ``regimes`` (the keys of an op
    configured per shape regime, ``()`` for one config per GPU), ``candidates`` (what the tuner
    tries, each a change of the current config: a list, or ``{regime: list}``), ``quick`` (the one
    variant ``tune --quick`` tries beside the current config) and ``smem`` (``{kernel name:
    estimate}``, see :func:`tile_bytes`). Raises ``ValueError`` when a config of the block names a
    key outside ``keys``, or its candidates a regime outside ``regimes``."""
    op: str
    keys: tuple[str, ...]
    interpreter: Mapping[str, Any]
    regimes: tuple[str, ...] = ()
    candidates: list[dict] | Mapping[str, list[dict]] = ()
    quick: Mapping[str, Any] = field(default_factory=dict)
    smem: Mapping[str, SmemEstimate] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "regimes", tuple(self.regimes))
        object.__setattr__(self, "interpreter", MappingProxyType(dict(self.interpreter)))
        per_regime = isinstance(self.candidates, Mapping)
        if per_regime and not set(self.candidates) <= set(self.regimes):
            raise ValueError(f"{self.op}: candidates for {sorted(self.candidates)}, regimes {list(self.regimes)}")
        cands = self.candidates.values() if per_regime else [self.candidates]
        for cfg in [self.interpreter, self.quick, *(c for group in cands for c in group)]:
            self.check_keys(cfg, where="launch block")

    def candidates_for(self, key: str | None) -> list[dict]:
        """The tuner's candidates for regime ``key`` (``None`` for an op with one config per GPU)."""
        return list(self.candidates.get(key, ()) if isinstance(self.candidates, Mapping) else self.candidates)

    def check_keys(self, cfg: Mapping, *, where: str | None = None) -> None:
        """Raise ``ValueError`` naming the allowed keys when ``cfg`` has others (``where``: the
        file or block it came from)."""
        unknown = sorted(set(cfg) - set(self.keys))
        if unknown:
            said = f"{where}: {self.op} has" if where else f"{self.op}:"
            raise ValueError(f"{said} unknown config keys {unknown}; allowed: {sorted(self.keys)}")


def tile_bytes(*tiles: tuple[int, ...], itemsize: int) -> int:
    """Bytes of the given tiles (each a shape) of one element size: the unit of every estimate."""
    return sum(math.prod(shape) for shape in tiles) * itemsize


def pipelined(num_stages: int, *loop_tiles_bytes: int) -> int:
    """Shared memory of the tiles a loop loads each iteration and feeds to ``tl.dot``: with
    ``num_stages >= 2`` the pipeliner keeps ``num_stages`` buffers of every one of them; without
    pipelining each tile is staged just before its dot, one at a time (the largest counts)."""
    if num_stages >= 2:
        return num_stages * sum(loop_tiles_bytes)
    return max(loop_tiles_bytes, default=0)


def attention_smem(q_rows: int, kv_rows: int, head_dim: int, *, q_itemsize: int, kv_itemsize: int,
                   num_stages: int) -> int:
    """Shared memory of an attention program that holds a ``[q_rows, head_dim]`` query tile for its
    whole walk and loads a ``[kv_rows, head_dim]`` K and V tile per step (:func:`pipelined`)."""
    q = tile_bytes((q_rows, head_dim), itemsize=q_itemsize)
    kv = tile_bytes((kv_rows, head_dim), itemsize=kv_itemsize)
    return q + pipelined(num_stages, kv, kv)


def family(caps: runtime.Capabilities) -> str:
    """The default family of a GPU: the newest of :data:`FAMILIES` whose compute capability and
    shared memory per block it has (the smallest family for anything older)."""
    for name, since, smem in FAMILIES:
        if (caps.major, caps.minor) >= since and caps.smem_per_block >= smem:
            return name
    return FAMILIES[-1][0]


def config_dir() -> Path:
    """Where tuned files are read and written: ``$MINIMAX_LAB_CONFIG_DIR`` or this package folder."""
    env = os.environ.get(ENV_DIR, "").strip()
    return Path(env) if env else PACKAGE_DIR


@functools.lru_cache(maxsize=None)
def _slug(name: str) -> str:
    return runtime.device_slug(name)


def device_slug() -> str:
    """This GPU's file-name slug (:func:`minimax_lab.runtime.device_slug` of its name)."""
    return _slug(runtime.capabilities().name)


def config_path(slug: str | None = None) -> Path:
    """The tuned-config file of a device (default: this one) in :func:`config_dir`."""
    return config_dir() / f"{slug or device_slug()}.json"


def family_path(name: str) -> Path:
    """The shipped default file of a family (``"sm_90"`` -> ``configs/sm_90.json``)."""
    return PACKAGE_DIR / f"{name}.json"


def interpreting() -> bool:
    return runtime.is_interpreter()


@functools.lru_cache(maxsize=64)
def _read_cached(path: str, mtime_ns: int) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("ops"), dict):
        raise ValueError(f"{path}: expected an object with an 'ops' object, got {type(data).__name__}")
    return data


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None


def read_file(path: Path | str) -> dict | None:
    """A config file's content (``None`` if there is none); cached until the file changes."""
    mtime = _mtime(str(path))
    return None if mtime is None else _read_cached(str(path), mtime)


def lookup(data: dict | None, launch: Launch, key: str | None = None, *, where: str = "") -> dict | None:
    """``launch``'s config (for ``key``, where the op is tuned per key) from a file's content, or
    ``None``; keys the op does not take raise ``ValueError`` naming the file (``where``)."""
    entry = (data or {}).get("ops", {}).get(launch.op)
    if entry is None:
        return None
    cfg = entry.get("by_key", {}).get(key) if "by_key" in entry else entry.get("config")
    if cfg is None:
        return None
    launch.check_keys(cfg, where=where)
    return dict(cfg)


def merge(launch: Launch, base: Mapping, config: Mapping | None) -> dict:
    """The one merge rule: ``{**base, **(config or {})}``; unknown keys raise ``ValueError``."""
    if config is not None and not isinstance(config, Mapping):
        raise ValueError(f"{launch.op}: config must be a dict or None, got {type(config).__name__}")
    launch.check_keys(config or {})
    return {**base, **(config or {})}


def gpu_config(launch: Launch, key: str | None = None, *, caps: runtime.Capabilities | None = None) -> dict:
    """``launch``'s base config on a GPU (default: this one) -- this GPU's tuned entry in
    :func:`config_dir`, else in this folder, else its family's default (:func:`family`). Raises
    ``KeyError`` when none has one (an op the family cannot run, e.g. FP8 before sm_89)."""
    paths = _search_path(os.environ.get(ENV_DIR, "").strip(), caps or runtime.capabilities())
    return _gpu_base(paths, tuple(_mtime(p) for p in paths), launch, key)


def launch_config(launch: Launch, *, key: str | None = None, config: Mapping | None = None) -> dict:
    """The launch config of ``launch``'s op here: its interpreter config under the interpreter, else
    :func:`gpu_config`; ``config`` overrides keys of it. ``key`` picks the entry of an op tuned per
    key (``moe_experts``: the shape regime)."""
    if interpreting():
        return merge(launch, launch.interpreter, config)
    return merge(launch, gpu_config(launch, key), config)


@functools.lru_cache(maxsize=16)
def _search_path(dir_env: str, caps: runtime.Capabilities) -> tuple[str, ...]:
    """The files :func:`gpu_config` reads for a GPU, first match wins (each once)."""
    slug = _slug(caps.name)
    tuned = (Path(dir_env) if dir_env else PACKAGE_DIR) / f"{slug}.json"
    found = [str(tuned), str(PACKAGE_DIR / f"{slug}.json"), str(family_path(family(caps)))]
    return tuple(dict.fromkeys(found))


@functools.lru_cache(maxsize=256)
def _gpu_base(paths: tuple[str, ...], mtimes: tuple[int | None, ...], launch: Launch, key: str | None) -> dict:
    """The first entry of the files as they are at these mtimes (the cache key; the result is
    never mutated: :func:`merge` copies it)."""
    for path, mtime in zip(paths, mtimes):
        if mtime is not None:
            cfg = lookup(_read_cached(path, mtime), launch, key, where=path)
            if cfg is not None:
                return cfg
    raise KeyError(f"no launch config for {launch.op!r}" + (f" key {key!r}" if key else "")
                   + f" in {', '.join(Path(p).name for p in paths)}")


def shared_memory_fits(nbytes: int, caps: runtime.Capabilities | None = None) -> bool:
    """Whether a program needing ``nbytes`` of shared memory (a launch block's estimate) fits the
    GPU (default: this one); always under the interpreter, which has no limit."""
    if caps is None:
        if interpreting():
            return True
        caps = runtime.capabilities()
    return nbytes <= caps.smem_per_block
