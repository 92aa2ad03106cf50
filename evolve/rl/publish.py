"""How a policy version reaches the servers, and the name it is served under.

Two ways (`train.serve`, resolved by `serve_mode`): `hot_load` loads each version's LoRA into
every endpoint by name; `merge` restarts the run's own embedded server on the version merged
into the weights (on a CPU a LoRA halves generation). Either way every search call names the
current version (`served`), so measuring a candidate version never redirects a call beside it.
"""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Callable

import httpx

from evolve.faults import Fault
from evolve.serving.adapters import load_adapter, serve_mode, unload_adapter
from evolve.serving.server import ServerError
from evolve.store.schema import PolicyVersion


class PublishError(RuntimeError):
    pass


class Publisher:
    def __init__(self, base_model: str, setting: str, run_dir: Path, server_url: str, server=None,
                 replicas: tuple[str, ...] | list[str] = (), unreachable: Callable[[str, str], None] | None = None):
        self.base_model = base_model
        self.served = base_model  # the name the current version is served under
        self.server, self.mode = server, serve_mode(setting, server)
        self.base_dir = server.model_dir if server is not None else None  # the base weights, before any restart
        self.merged = Path(run_dir) / "merged"  # one merged copy is kept on disk (the model's size)
        self.urls = [server_url.rstrip("/"), *(u.rstrip("/") for u in replicas)]  # each endpoint serves each version
        self.unreachable = unreachable  # several endpoints: take one out that cannot load a version

    def name_of(self, version: PolicyVersion) -> str:
        return version.model if version.version > 0 else self.base_model

    async def serve(self, version: PolicyVersion) -> float:
        """Make `version` servable (merged: the server restarts on it; hot-loaded: its LoRA is
        loaded beside the current one); seconds it took."""
        return await (self._restart_on(version) if self.mode == "merge" else self._load(version))

    async def resume(self, version: PolicyVersion) -> float:
        """A fresh server knows no adapter: serve the run's latest version again and route to it."""
        took = await self.serve(version) if self.mode == "merge" or version.version > 0 else 0.0
        self.served = self.name_of(version)
        return took

    async def switch(self, new: PolicyVersion, old: PolicyVersion) -> None:
        """`new` serves the search from now on; a hot-loaded `old` is never asked for again."""
        self.served = self.name_of(new)
        if self.mode == "hot_load" and old.version > 0:
            await self._unload(old.model)

    async def withdraw(self, name: str, current: PolicyVersion) -> None:
        """A refused version: merged, the server goes back to `current`; hot-loaded, unloaded."""
        if self.mode == "merge":
            await self._restart_on(current)
        else:
            await self._unload(name)

    def stop_server(self, why: str) -> None:
        self.server.stop(why=why)

    async def _load(self, version: PolicyVersion) -> float:
        """Hot-load a version into every endpoint; the slowest load's seconds. A replica that
        cannot be reached is taken out (evolve/serving/endpoints.py) and given the version on return."""
        if version.adapter_path is None:
            raise PublishError(f"policy v{version.version} ({version.model}) has no adapter to load")
        took = []
        for url in self.urls:
            try:
                took.append(await load_adapter(url, version.model, version.adapter_path))
            except httpx.TransportError as exc:
                if self.unreachable is None:  # one endpoint: the caller's fault handling decides
                    raise
                self.unreachable(url, f"could not load {version.model}: {type(exc).__name__}")
        if not took:
            raise PublishError(f"no policy endpoint could load {version.model} ({version.adapter_path})")
        return max(took)

    async def _unload(self, name: str) -> None:
        for url in self.urls:
            await unload_adapter(url, name)

    async def _restart_on(self, version: PolicyVersion) -> float:
        """Restart the server on `version` merged into the weights (the base for v0), unless it
        serves them already; seconds it took."""
        from evolve.rl.trainer import serve_merged

        assert self.server is not None and self.base_dir is not None, "serve_mode merges only for the run's own server"
        started = asyncio.get_running_loop().time()
        try:
            await asyncio.to_thread(serve_merged, self.server, self.base_dir, self.base_model, version.version,
                                    version.model, version.adapter_path, self.merged)
        except ServerError as exc:  # the run stops cleanly; a resume starts the server afresh
            raise Fault(f"the policy server did not restart on {version.model}: {str(exc).split(';')[0]} "
                        f"(see {self.server.log_path}); `evolve resume` goes on from the last published "
                        "version") from exc
        weights = self.merged / f"v{version.version}"
        for old in self.merged.glob("v*") if version.version > 0 else ():
            if old != weights:
                shutil.rmtree(old, ignore_errors=True)
        return asyncio.get_running_loop().time() - started
