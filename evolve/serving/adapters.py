"""LoRA adapters hot-loaded into (and dropped from) a running vLLM server by name, and the choice
between that and serving them merged into the weights."""
from __future__ import annotations

import time

import httpx


class AdapterError(RuntimeError):
    """The server refused an adapter (one line: which, why, what to check)."""


async def load_adapter(server_url: str, name: str, path: str) -> float:
    """Load (or replace) a PEFT adapter in a running vLLM server; seconds it took."""
    started = time.time()
    async with httpx.AsyncClient(timeout=300) as http:
        resp = await http.post(f"{server_url}/v1/load_lora_adapter",
                               json={"lora_name": name, "lora_path": str(path), "load_inplace": True})
    if resp.status_code != 200:
        raise AdapterError(f"the server at {server_url} refused adapter {name} ({path}): "
                        f"HTTP {resp.status_code} {resp.text[:300]}. Is it started with --enable-lora "
                        "and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True?")
    return time.time() - started


async def unload_adapter(server_url: str, name: str) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        await http.post(f"{server_url}/v1/unload_lora_adapter", json={"lora_name": name})


def serve_mode(setting: str, server) -> str:
    """How published versions are served: `merge` needs the run's own embedded server; `auto`
    merges where there is no GPU (a CPU server loses half its speed to a LoRA)."""
    own = server is not None and not server.reused
    if setting == "hot_load" or not own:
        return "hot_load"
    if setting == "merge":
        return "merge"
    import torch

    return "hot_load" if torch.cuda.is_available() else "merge"
