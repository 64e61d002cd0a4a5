"""``tl.watch``'s explorer server in a process of its own, so that page loads cost training nothing.

The training process binds the socket (a busy port fails before training starts) and starts
``python -m torchlens.train.serve``, which inherits the listening socket and serves it from the
run database alone, at a lower CPU priority. Until that process is ready (it imports torch,
which takes a second or two) a thread of the training process answers on the same socket, so
the page is live at once; a serving process that fails to start leaves that thread serving.

The serving process ends when the watch closes, when the training process exits (``atexit``)
and by itself when the training process dies: its stdin (a pipe from the training process)
reaches end-of-file, or its parent process id changes.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from typing import Optional

from .server import RunServer, bind, default_token, server_url

_PARENT_CHECK_S = 0.5  # the socket's accept timeout while two processes share it
_PARENT_POLL_S = 0.1  # how often the serving process looks for its parent (end of file comes at once)
_NICE = 10
# lower the priority before importing torch (the slow part of starting), then run __main__.py
_BOOT = (
    f"import os\ntry:\n    os.nice({_NICE})\nexcept OSError:\n    pass\n"
    "import runpy\nrunpy.run_module('torchlens.train.serve', run_name='__main__', alter_sys=True)"
)


class ServingProcess:
    """The explorer server of one watch: bound now, serving from ``start(root)`` to ``close()``.

    Example:
        >>> import json, tempfile, urllib.request
        >>> serving = ServingProcess(port=0).start(tempfile.mkdtemp())
        >>> json.load(urllib.request.urlopen(serving.url + "/api/runs"))
        {'runs': []}
        >>> serving.close()
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 8080) -> None:
        self.sock = bind(host, port)
        self.sock.settimeout(_PARENT_CHECK_S)  # two processes accept on it while handing over: never block in accept
        self.host, self.port = host, self.sock.getsockname()[1]
        self.token = default_token(host)
        self.process: Optional[subprocess.Popen] = None
        self._local: Optional[RunServer] = None  # the thread that serves until the process is ready
        self._lock = threading.Lock()
        self._reader: Optional[threading.Thread] = None
        self._handed_over = threading.Event()

    @property
    def url(self) -> str:
        """The address to open (with ``?token=`` when the server wants one)."""
        return server_url(self.host, self.port, self.token)

    @property
    def ready(self) -> bool:
        """The serving process answers (the training process serves nothing any more)."""
        return self._handed_over.is_set() and self.process is not None and self.process.poll() is None

    def start(self, root: str) -> "ServingProcess":
        self._local = RunServer(root, host=self.host, token=self.token, sock=self.sock).start()
        if os.name != "posix":  # no socket to hand over: serve from the thread
            return self
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([package_parent] + [p for p in [env.get("PYTHONPATH")] if p])
        config = {"root": root, "host": self.host, "token": self.token, "fd": self.sock.fileno(), "parent": os.getpid()}
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, "torchlens.train.serve"],  # the last: a name for ps
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=(self.sock.fileno(),),
                env=env,
            )
            self.process.stdin.write(json.dumps(config).encode() + b"\n")  # not in argv: others can read that
            self.process.stdin.flush()
        except OSError:  # no process for us: the thread keeps serving
            process, self.process = self.process, None
            if process is not None:
                process.kill()
                process.wait()
            return self
        self._reader = threading.Thread(
            target=self._follow_child, args=(self.process,), name="torchlens-explorer-start", daemon=True
        )
        self._reader.start()
        return self

    def _follow_child(self, process: subprocess.Popen) -> None:
        """Hand over once the serving process is ready; reap it as soon as it ends, whatever ended it."""
        try:
            if process.stdout.readline().strip() == b"ready":
                with self._lock:
                    local, self._local = self._local, None
                if local is not None:
                    local.close()  # closes this process's copy of the socket; the serving process has its own
                self._handed_over.set()
                process.stdout.read()  # it writes nothing more: this returns when it exits
        except (OSError, ValueError):  # the pipe closed under us: close() is stopping it
            pass
        process.wait()

    def wait_ready(self, timeout: float = 30.0) -> bool:
        """Wait until the serving process answers; ``False`` if it did not within ``timeout`` s."""
        self._handed_over.wait(timeout if self.process is not None else 0)
        return self.ready

    def close(self) -> None:
        """Stop serving: the process (waited for, so no zombie is left) and the thread."""
        process, self.process = self.process, None
        if process is not None:
            process.terminate()  # it only reads: nothing to finish
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
            self._reader = None
        if process is not None:
            for pipe in (process.stdin, process.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
        with self._lock:
            local, self._local = self._local, None
        if local is not None:
            local.close()
        self.sock.close()


def _follow_parent(server: RunServer, parent: int) -> None:
    """End serving when the training process closes our stdin, exits or dies: at once (the
    process only reads, nothing is left to finish), so that the port is free for a trainer
    restarted straight away."""
    stdin = sys.stdin.fileno()
    while os.getppid() == parent:
        readable, _, _ = select.select([stdin], [], [], _PARENT_POLL_S)
        if readable and not os.read(stdin, 4096):
            break  # end of file: the parent is gone (or closed the pipe)
    try:
        server.httpd.socket.close()  # the port is free from here on
    finally:
        os._exit(0)  # not shutdown(): serve_forever would notice only at its next poll


def main() -> None:
    """The serving process: ``python -m torchlens.train.serve`` with its settings on stdin."""
    import socket

    config = json.loads(sys.stdin.buffer.readline())
    try:
        os.nice(max(0, _NICE - os.nice(0)))  # training comes first when both want the CPU
    except (AttributeError, OSError):
        pass
    sock = socket.socket(fileno=config["fd"])
    sock.settimeout(_PARENT_CHECK_S)  # the training process may take a connection first while handing over
    server = RunServer(config["root"], host=config["host"], token=config["token"], sock=sock)
    threading.Thread(target=_follow_parent, args=(server, config["parent"]), daemon=True).start()
    print("ready", flush=True)
    server.serve_forever()


__all__ = ["ServingProcess", "main"]
