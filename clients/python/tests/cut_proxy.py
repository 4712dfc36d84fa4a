"""A proxy between the tests and the server (TCP in front of the server's
Unix socket, from the PG* environment) that can cut every connection, as a
server restart or a network blip does."""

import os
import socket
import threading
import time


class CutProxy:
    def __init__(self):
        self.target = os.path.join(os.environ["PGHOST"], f".s.PGSQL.{os.environ.get('PGPORT', '5432')}")
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.sockets = set()
        self.refuse = False
        self.cut_after = False    # the next statement reaches the server, then every connection is cut
        threading.Thread(target=self._serve, daemon=True).start()

    def conninfo(self):
        return f"host=127.0.0.1 port={self.port} sslmode=disable"

    def close(self):
        self.listener.close()
        self.cut()

    def _serve(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refuse:
                client.close()
                continue
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets.update((client, server))
            muted = threading.Event()    # the server's answers no longer reach the client
            threading.Thread(target=self._pipe, args=(client, server, muted, _MessageReader()), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, muted, None), daemon=True).start()

    def _pipe(self, source, sink, muted, messages):
        while True:
            try:
                chunk = source.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                for s in (source, sink):
                    _close(s)
                return
            cut_now = False
            if messages is not None and messages.executes(chunk):
                with self.lock:
                    cut_now, self.cut_after = self.cut_after, False
                if cut_now:
                    muted.set()
            if messages is None and muted.is_set():
                continue
            try:
                sink.sendall(chunk)
            except OSError:
                return
            if cut_now:
                time.sleep(0.3)
                self.cut_for(1.0)
                return

    def cut(self):
        with self.lock:
            sockets, self.sockets = self.sockets, set()
        for s in sockets:
            _close(s)

    def cut_for(self, seconds):
        """Cuts every connection and refuses new ones for ``seconds``."""
        self.refuse = True
        self.cut()
        threading.Timer(seconds, lambda: setattr(self, "refuse", False)).start()

    def cut_after_next_statement(self):
        """The next statement a client runs reaches the server, then every
        connection is cut (for 1 s) before its answer comes back."""
        with self.lock:
            self.cut_after = True


def _close(s):
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


class _MessageReader:
    """Follows the messages a client sends (the startup message, then a type
    byte and a length each) to tell when one has a statement run and
    committed: a whole Query, or the Sync after an Execute."""

    def __init__(self):
        self.started, self.header, self.left, self.query, self.executed = False, b"", 0, False, False

    def executes(self, chunk):
        runs, at = False, 0
        while at < len(chunk):
            if self.left > 0:
                n = min(self.left, len(chunk) - at)
                self.left -= n
                at += n
                if self.left == 0 and self.query:
                    runs, self.query = True, False
                continue
            size = 5 if self.started else 4
            n = min(size - len(self.header), len(chunk) - at)
            self.header += chunk[at:at + n]
            at += n
            if len(self.header) < size:
                break
            length = int.from_bytes(self.header[size - 4:size], "big")
            if self.started:
                kind = self.header[:1]
                if kind == b"Q":
                    self.query = True
                elif kind == b"E":
                    self.executed = True
                elif kind == b"S":
                    runs, self.executed = runs or self.executed, False
            self.left, self.started, self.header = length - 4, True, b""
        return runs
