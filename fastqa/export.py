"""Slim exports: the weights, config and vocabularies a trained model needs to be used, nothing of training.

``fastqa export RUN OUT [--half]`` turns any run folder (a reader or a translator: this module knows no
model) into a folder that ``QAModel.load`` / ``Translator.load`` read as they read the run::

    OUT/model.safetensors   the weights (the EMA's when the run kept one), float32 or float16 (--half)
    OUT/config.json         {"format", "kind", "meta": the checkpoint's meta, "weights", "files", "source"}
    OUT/subword.model ...   meta values that are bytes (a SentencePiece model), one side file each; the
                            JSON holds {"$bytes": "<file name>"} in their place
    OUT/README.md           a model card stub: kind, source run, parameters, size, last evaluation

``load_export(OUT)`` gives back the payload shape ``fastqa.train.load_checkpoint`` gives (``kind``,
``meta``, ``model`` weights in float32, ``ema`` None), so a loader takes either; ``load_model_payload``
picks the right one for a path. Every file the export writes besides config.json has its sha256 and size
in config.json: a damaged, truncated or missing file is a ``UserError`` naming it, never wrong numbers.
Optimizer state, RNG states and the data position are left out: an export cannot resume training.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from .data.files import atomic_open, atomic_write_text, read_json
from .errors import UserError
from .train.checkpoint import CHECKPOINT_NAME, inference_weights, load_checkpoint

__all__ = ["EXPORT_FORMAT", "CONFIG_NAME", "WEIGHTS_NAME", "export_run", "load_export", "is_export",
           "load_model_payload"]

EXPORT_FORMAT = "fastqa-export-1"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CARD_NAME = "README.md"
#: meta keys a model folder may hold in a file of their own, fitted after training (``fastqa qa-calibrate``
#: writes a reader's calibration, ``fastqa mt-eval --fit-confidence`` a translator's confidence floor): loading
#: the folder puts them in the meta, so an export carries them
META_FILES = {"calibration": "calibration.json", "confidence": "confidence.json"}
BYTES_KEY = "$bytes"  # {"$bytes": name}: a meta value that was bytes, kept in the side file ``name``

# Side-file names for known bytes-valued meta keys (the file is what a user would recognise); any other
# bytes value is named after its key path.
_SIDE_NAMES = {"sentencepiece": "subword.model"}
_FP16_MAX = 65504.0


def _require_safetensors():
    try:
        import safetensors.torch as st
    except ImportError:
        raise UserError("exports are safetensors files: pip install 'safetensors>=0.4' "
                        "(or pip install 'fastqa[models]')") from None
    return st


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------------ meta

def _meta_to_json(value: Any, path: tuple[str, ...], side: dict[str, bytes]) -> Any:
    """``value`` as JSON-able data; bytes go to ``side`` (file name -> bytes) and leave a reference.

    Tuples become lists (configs are read back with ``from_dict``, which takes either); anything JSON cannot
    hold exactly (a non-str key, an object) is refused with the key path, never converted silently."""
    where = ".".join(path) or "meta"
    if isinstance(value, (bytes, bytearray, memoryview)):
        base = _SIDE_NAMES.get(path[-1] if path else "", f"{where}.bin")
        name, k = base, 1
        while name in side or name in (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME):
            stem, dot, ext = base.rpartition(".")
            name = f"{stem}-{k}.{ext}" if dot else f"{base}-{k}"
            k += 1
        side[name] = bytes(value)
        return {BYTES_KEY: name}
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise UserError(f"the checkpoint's meta has a key {k!r} of type {type(k).__name__} at {where}; "
                                "an export keeps only str keys (JSON)")
            out[k] = _meta_to_json(v, (*path, k), side)
        return out
    if isinstance(value, (list, tuple)):
        return [_meta_to_json(v, (*path, str(i)), side) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"the checkpoint's meta holds {value} at {where}, which JSON cannot store")
        return value
    raise UserError(f"the checkpoint's meta holds a {type(value).__name__} at {where}; an export keeps JSON "
                    "values and bytes only")


def _meta_from_json(value: Any, folder: Path, files: dict[str, dict]) -> Any:
    """Inverse of ``_meta_to_json``: references replaced by the verified bytes of their side files."""
    if isinstance(value, dict):
        if set(value) == {BYTES_KEY}:
            return _read_verified(folder, value[BYTES_KEY], files)
        return {k: _meta_from_json(v, folder, files) for k, v in value.items()}
    if isinstance(value, list):
        return [_meta_from_json(v, folder, files) for v in value]
    return value


def _read_verified(folder: Path, name: Any, files: dict[str, dict]) -> bytes:
    """The bytes of ``folder/name``, checked against the size and sha256 config.json recorded."""
    config = folder / CONFIG_NAME
    if not isinstance(name, str) or not name or Path(name).name != name:
        raise UserError(f"{config}: {name!r} is not a file name of the export")
    entry = files.get(name)
    if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and isinstance(entry.get("bytes"), int)):
        raise UserError(f"{config}: no checksum for {name} (the config is incomplete)")
    path = folder / name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: missing from the export (copy the whole folder)") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) != entry["bytes"]:
        raise UserError(f"{path}: damaged export: {len(data)} bytes where {entry['bytes']} were written "
                        "(a truncated or partial copy)")
    if _sha256(data) != entry["sha256"]:
        raise UserError(f"{path}: damaged export: checksum mismatch (the file changed after it was written)")
    return data


# ---------------------------------------------------------------------------------------------- export

def _weights_to_save(weights: dict[str, torch.Tensor], half: bool) -> tuple[dict[str, torch.Tensor], list[str]]:
    """CPU, contiguous, unshared tensors (safetensors refuses tensors that share memory: tied weights are
    stored twice); floating ones in float16 with ``half`` unless a value would overflow it, in float32
    otherwise. Returns (tensors, names kept in float32 because float16 cannot hold them)."""
    out: dict[str, torch.Tensor] = {}
    kept: list[str] = []
    seen: set[int] = set()
    for name, t in weights.items():
        if not isinstance(t, torch.Tensor):
            raise UserError(f"the checkpoint's weight {name!r} is a {type(t).__name__}, not a tensor")
        t = t.detach().to("cpu")
        if t.is_floating_point():
            if half and t.numel() and float(t.abs().max()) > _FP16_MAX:
                kept.append(name)
                t = t.float()
            else:
                t = t.half() if half else t.float()
        t = t.contiguous()
        if t.numel() and t.data_ptr() in seen:
            t = t.clone()
        if t.numel():
            seen.add(t.data_ptr())
        out[name] = t
    return out, kept


def _last_eval(run: Path) -> dict | None:
    """The last evaluation row of ``run/metrics.jsonl`` (for the model card), or None."""
    try:
        lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line of a run that was killed
        if isinstance(row, dict) and row.get("kind") == "eval":
            return row
    return None


def _human_size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} bytes"  # unreachable


def _model_card(config: dict, weights_bytes: int, metrics: dict | None) -> str:
    kind, w, src = config["kind"], config["weights"], config["source"]
    rows = [("kind", kind), ("source run", f"`{src['run']}` (step {src.get('step', '?')})"),
            ("weights", f"{w['source']} weights, {w['dtype']}"), ("parameters", f"{w['parameters']:,}"),
            ("size", f"{_human_size(weights_bytes)} ({WEIGHTS_NAME})"),
            ("made with", f"fastqa {src['fastqa']}, torch {src['torch']}")]
    meta = config["meta"]
    model_config = meta.get("config") if isinstance(meta, dict) else None
    if isinstance(model_config, dict):
        shown = ", ".join(f"{k}={v}" for k, v in model_config.items() if isinstance(v, (int, float, str, bool)))
        rows.append(("config", shown))
    if metrics:
        shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()
                          if k not in ("kind", "time") and isinstance(v, (int, float)))
        rows.append(("last evaluation", shown))
    lines = [f"# {kind} (fastqa export)", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows]
    lines += ["", "Use it wherever a run folder is taken (`--model THIS_FOLDER`, `load(\"THIS_FOLDER\")`), or read it:",
              "", "```python",
              "from fastqa.export import load_export", "payload = load_export(\"THIS_FOLDER\")  "
              "# kind, meta (config, vocabularies), float32 weights", "```", "",
              ("Before sharing this model, add its intended use, training data and split, held-out scores with the "
               "commands that produced them, and its limitations (the shipped models' cards show the form)."), ""]
    return "\n".join(lines)


def _existing_export_files(out: Path) -> set[str] | None:
    """The files an earlier export in ``out`` wrote (to replace them), an empty set for an absent or empty
    folder; None when ``out`` holds something else (never overwritten)."""
    if not out.exists():
        return set()
    if not out.is_dir():
        return None
    present = {p.name for p in out.iterdir()}
    if not present:
        return set()
    try:
        old = json.loads((out / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(old, dict) or old.get("format") != EXPORT_FORMAT:
        return None
    return {CONFIG_NAME, CARD_NAME, *(old.get("files") or {})}


def export_run(run: str | os.PathLike, out: str | os.PathLike, *, half: bool = False) -> Path:
    """Write the slim export of ``run`` (a run folder, its checkpoint.pt, or another export) into ``out``.

    half: store floating weights in float16 (half the size; answers close to the float32 ones).
    ``out`` must be absent, empty or an earlier export (replaced file by file, config.json last, so a
    reader never sees new weights with an old config's checksums pass). Returns ``out``.
    """
    st = _require_safetensors()
    run, out = Path(run), Path(out)
    payload, source = load_model_payload(run)
    if source.resolve().parent == out.resolve():
        raise UserError(f"{out}: is the folder being exported; export into another folder")
    old_files = _existing_export_files(out)
    if old_files is None:
        raise UserError(f"{out}: exists and is not an export (choose a new or empty folder)")
    kind = payload.get("kind")
    if not isinstance(kind, str) or not kind:
        raise UserError(f"{source}: the checkpoint names no model kind")
    side: dict[str, bytes] = {}
    meta = _meta_to_json(payload.get("meta") or {}, (), side)
    weights_from = "ema" if payload.get("ema") else "model"
    tensors, kept_fp32 = _weights_to_save(inference_weights(payload), half)
    blob = st.save(tensors, metadata={"format": EXPORT_FORMAT, "kind": kind})
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in tensors.values() if t.is_floating_point()})
    files = {WEIGHTS_NAME: {"sha256": _sha256(blob), "bytes": len(blob)}}
    files.update({name: {"sha256": _sha256(data), "bytes": len(data)} for name, data in side.items()})
    config = {
        "format": EXPORT_FORMAT,
        "kind": kind,
        "meta": meta,
        "weights": {"file": WEIGHTS_NAME, "source": weights_from, "dtype": "/".join(dtypes) or "none",
                    "parameters": sum(t.numel() for t in tensors.values()), "kept_float32": kept_fp32},
        "files": files,
        "source": {"run": str(run), "step": payload.get("step"), "fastqa": _version(), "torch": torch.__version__},
    }
    out.mkdir(parents=True, exist_ok=True)
    with atomic_open(out / WEIGHTS_NAME, "wb") as f:
        f.write(blob)
    for name, data in side.items():
        with atomic_open(out / name, "wb") as f:
            f.write(data)
    metrics = _last_eval(source.parent) if source.name == CHECKPOINT_NAME else None
    atomic_write_text(out / CARD_NAME, _model_card(config, len(blob), metrics))
    atomic_write_text(out / CONFIG_NAME, json.dumps(config, indent=1, ensure_ascii=False) + "\n")
    for stale in old_files - set(files) - {CONFIG_NAME, CARD_NAME}:
        if Path(stale).name == stale:
            (out / stale).unlink(missing_ok=True)
    # A calibration fitted on the export this one replaces would win over the new meta's (``META_FILES``).
    for name in META_FILES.values():
        (out / name).unlink(missing_ok=True)
    return out


def _version() -> str:
    from ._version import __version__

    return __version__


# ---------------------------------------------------------------------------------------------- import

def is_export(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an export folder (or its config.json) rather than a run folder or checkpoint."""
    p = Path(path)
    if p.is_dir():
        return (p / CONFIG_NAME).is_file() and not (p / CHECKPOINT_NAME).is_file()
    return p.name in (CONFIG_NAME, WEIGHTS_NAME) and (p.parent / CONFIG_NAME).is_file()


def load_export(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """The payload of an export folder (or its config.json): ``{"format", "kind", "meta", "model", "ema":
    None, "export"}`` with the weights in float32 on ``map_location``, the shape ``load_checkpoint`` gives.

    A missing, malformed, incomplete or damaged file is a ``UserError`` naming it."""
    folder = Path(path)
    if folder.name in (CONFIG_NAME, WEIGHTS_NAME) and not folder.is_dir():
        folder = folder.parent
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        raise UserError(f"{config_path}: no such file (not a fastqa export: expected {CONFIG_NAME} and "
                        f"{WEIGHTS_NAME})")
    config = read_json(config_path)
    if not isinstance(config, dict) or config.get("format") != EXPORT_FORMAT:
        fmt = config.get("format") if isinstance(config, dict) else None
        raise UserError(f"{config_path}: not a fastqa export (format {fmt!r}, expected {EXPORT_FORMAT!r})")
    for key, kind in (("kind", str), ("meta", dict), ("files", dict), ("weights", dict)):
        if not isinstance(config.get(key), kind):
            raise UserError(f"{config_path}: missing or invalid {key!r} (the config is incomplete)")
    files = config["files"]
    weights_name = config["weights"].get("file", WEIGHTS_NAME)
    st = _require_safetensors()
    blob = _read_verified(folder, weights_name, files)
    try:
        tensors = st.load(blob)
    except Exception as e:  # safetensors raises its own SafetensorError for a malformed header
        raise UserError(f"{folder / weights_name}: not a readable safetensors file ({e})") from None
    weights = {k: (v.float() if v.is_floating_point() else v).to(map_location) for k, v in tensors.items()}
    meta = _meta_from_json(config["meta"], folder, files)
    return {"format": EXPORT_FORMAT, "kind": config["kind"], "meta": meta, "model": weights, "ema": None,
            "step": config.get("source", {}).get("step"), "export": {k: config[k] for k in ("weights", "source")
                                                                      if k in config}}


def load_model_payload(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> tuple[dict, Path]:
    """(payload, the file it came from) for a run folder, a checkpoint file or an export: what a model's
    ``load`` calls so that it reads all three. Errors are ``UserError`` naming the file."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if is_export(p):
        payload, source = load_export(folder, map_location), folder / CONFIG_NAME
    else:
        payload, source = load_checkpoint(p, map_location), (p / CHECKPOINT_NAME if p.is_dir() else p)
    # Settings fitted after training sit beside the weights, and win over the meta's (``META_FILES``).
    for key, name in META_FILES.items():
        if (folder / name).is_file():
            payload["meta"] = {**(payload.get("meta") or {}), key: read_json(folder / name)}
    return payload, source
