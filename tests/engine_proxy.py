"""A Docker engine that can go away and come back, for one client only."""
import os
import socket
import threading
from pathlib import Path


class EngineProxy:
    """A unix socket that forwards to the real engine and can be cut and restored: the engine
    goes away for one sandbox without stopping dockerd for everybody else."""

    def __init__(self, path: Path, target: str):
        self.path, self.target = str(path), target
        self.connections: list[socket.socket] = []
        self.listener = None

    def start(self):
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(self.path)
        self.listener.listen(64)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def stop(self):
        self.listener.close()
        os.unlink(self.path)
        for conn in self.connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self.connections = []

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.target)
            self.connections += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)  # half-close: the exec's stdin EOF
        except OSError:
            pass
