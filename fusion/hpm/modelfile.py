"""The model file: an npz archive of plain arrays and a JSON header. Nothing in it is code, and nothing on the load
path can run code: the archive is read with `allow_pickle=False` (an object array is refused, not unpickled).

The archive's first member is `dynfuse_hpm.npy`, the header (one JSON string): format name and version, feature
schema (names and hash), the generator stamp of the calibration (`fusion.hpm.stamp`), each predictor's kind and
array names, training metadata. Its name, at a fixed offset of the first zip entry, is the file's magic, so a
truncated model file is still recognised as one. Loading sorts what can go wrong into:

- `ModelFileError`: not an HPM model at all (no such regular file, too large, another kind of file): an error.
- `CorruptModelError`: an HPM model file that does not parse (truncated, damaged, malformed arrays).
- `StaleModelError` / `SchemaMismatchError`: another format version (the pickled container of earlier versions
  included: it is never unpickled), another feature schema, or other kernel generators than this code's.

The last two are `UnusableModelError`s: the cost-model resolver warns in one line and plans with the analytic
model (`fusion.hpm.cost_model`).
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from fusion.hpm.errors import CorruptModelError, ModelFileError, SchemaMismatchError, StaleModelError
from fusion.hpm.model import PAIRS, TARGETS, HpmModel
from fusion.hpm.predictors import from_arrays
from fusion.hpm.schema import FEATURE_NAMES, SCHEMA_VERSION, schema_hash
from fusion.hpm.stamp import generator_hash

FORMAT = "dynfuse-hpm"
FORMAT_VERSION = 2
HEADER = "dynfuse_hpm"
MAGIC = b"PK\x03\x04"  # a zip archive whose first entry's name (at offset 30) is HEADER.npy
NAME_OFFSET = 30
LEGACY_MAGIC = b"DYNFUSE-HPM\n"  # format 1: a pickled payload
MAX_FILE_BYTES = 1 << 30
MAX_ARRAY_BYTES = 4 << 30  # uncompressed, all members together (a zip bomb is refused before inflating)
MAX_HEADER_BYTES = 16 << 20
PARSE_ERRORS = (zipfile.BadZipFile, zlib.error, ValueError, KeyError, TypeError, EOFError, OSError, RecursionError)


def save_model(model: HpmModel, path: Path) -> Path:
    """Write atomically: a temporary file in the same directory, renamed over `path`; removed if anything fails."""
    path = Path(path)
    if path.is_dir():
        raise ModelFileError(f"{path} is a directory; give the model file's path (e.g. {path / 'hpm.npz'})")
    arrays = {f"{name}.{key}": arr for name, p in model.predictors.items() for key, arr in p.arrays().items()}
    header = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "schema_version": SCHEMA_VERSION,
        "schema_hash": schema_hash(model.feature_names),
        "feature_names": list(model.feature_names),
        "generators": model.generators,
        "predictors": {name: p.kind for name, p in model.predictors.items()},
        "arrays": sorted(arrays),
        "meta": model.meta,
    }
    members = {HEADER: np.array(json.dumps(header, sort_keys=True)), **arrays}  # the header first: the magic
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, **members)
        os.chmod(tmp, 0o644)  # a model file is data anyone may read (mkstemp makes it private)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def is_model_file(path: Path) -> bool:
    with Path(path).open("rb") as f:
        head = f.read(NAME_OFFSET + len(HEADER) + 4)
    return head.startswith(MAGIC) and head[NAME_OFFSET:] == f"{HEADER}.npy".encode()


def read_model_file(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(header, arrays) of a model file, after the checks that tell a model from other files; no stamp checks."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"no HPM model file at {path}")
    if not path.is_file():
        raise ModelFileError(f"{path} is not a regular file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ModelFileError(f"{path}: {path.stat().st_size} bytes, more than a model file ({MAX_FILE_BYTES})")
    with path.open("rb") as f:
        legacy = f.read(len(LEGACY_MAGIC)) == LEGACY_MAGIC
    if legacy:
        raise StaleModelError(
            f"{path}: a pickled model of an earlier dynfuse (format 1), not loaded since unpickling can run code; "
            "retrain it with `dynfuse hpm train`"
        )
    if not is_model_file(path):
        raise ModelFileError(f"{path}: not an HPM model file")
    try:
        return _read_archive(path)
    except PARSE_ERRORS as err:
        raise CorruptModelError(f"{path}: damaged HPM model file ({type(err).__name__}: {err})") from None


def _read_archive(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as npz:
        sizes = {info.filename: info.file_size for info in npz.zip.infolist()}
        if sum(sizes.values()) > MAX_ARRAY_BYTES or sizes.get(f"{HEADER}.npy", 0) > MAX_HEADER_BYTES:
            raise ValueError("members larger than a model's")
        header = json.loads(str(npz[HEADER][()]))
        if not isinstance(header, dict) or not isinstance(header.get("arrays"), list):
            raise ValueError("the header is not a model header")
        names = [str(n) for n in header["arrays"]]
        unknown = set(npz.files) - {HEADER, *names}
        if unknown:
            raise ValueError(f"members the header does not list: {sorted(unknown)[:3]}")
        return header, {name: npz[name] for name in names}


def load_model(path: Path, check_generators: bool = True) -> HpmModel:
    """The model in `path`, refused (see the module docstring) unless it is current for this code: its format
    version, its feature schema and, with `check_generators`, its generator stamp."""
    header, arrays = read_model_file(path)
    if header.get("format") != FORMAT or header.get("version") != FORMAT_VERSION:
        raise StaleModelError(
            f"{path}: model format {header.get('format')!r} version {header.get('version')!r}, this code reads "
            f"{FORMAT!r} version {FORMAT_VERSION}; retrain it with `dynfuse hpm train`"
        )
    names = tuple(str(n) for n in header.get("feature_names", ()))
    if header.get("schema_hash") != schema_hash() or names != FEATURE_NAMES:
        missing = [n for n in FEATURE_NAMES if n not in names]
        extra = [n for n in names if n not in FEATURE_NAMES]
        detail = f"missing {missing[:5]}, unknown {extra[:5]}" if missing or extra else "same names, other order"
        raise SchemaMismatchError(
            f"{path}: trained on feature schema {header.get('schema_hash')} (v{header.get('schema_version')}), "
            f"this code computes {schema_hash()} (v{SCHEMA_VERSION}): {detail}; retrain with `dynfuse hpm train` "
            "(the shipped model: `make hpm`)"
        )
    stamp = str(header.get("generators"))
    if check_generators and stamp != generator_hash():
        raise StaleModelError(
            f"{path}: calibrated on kernel generators {stamp}, this code's are {generator_hash()}: "
            "recalibrate and retrain (`make hpm`)"
        )
    try:
        predictors = {
            str(name): from_arrays(str(kind), _members(arrays, str(name)), len(FEATURE_NAMES) * (1 + (name == PAIRS)))
            for name, kind in dict(header["predictors"]).items()
        }
    except PARSE_ERRORS as err:
        raise CorruptModelError(f"{path}: damaged HPM model file ({type(err).__name__}: {err})") from None
    except CorruptModelError as err:
        raise CorruptModelError(f"{path}: damaged HPM model file ({err})") from None
    if any(target not in predictors for target in TARGETS):
        raise CorruptModelError(f"{path}: damaged HPM model file (predictors {sorted(predictors)}, need {TARGETS})")
    meta = header.get("meta")
    return HpmModel(predictors, stamp, names, dict(meta) if isinstance(meta, dict) else {})


def _members(arrays: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    prefix = f"{name}."
    return {key[len(prefix) :]: arr for key, arr in arrays.items() if key.startswith(prefix)}
