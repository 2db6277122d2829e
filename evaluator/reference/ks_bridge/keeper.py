"""A kept resident reference (`--keep-reference`): after its manifest, the
bridge stays on with the reference on the GPU, and later commands of the same
problem lease it over a Unix socket instead of starting python, importing
torch and computing the reference again.

Leases. Each lease is a connection: the first command's is the bridge's stdin
(its end is EOF), a later command's is its socket connection. While any lease
is open the bridge stays. With none, it waits `keep_s` seconds for the next
and then exits, which frees the GPU memory. {"stop": true} ends it as soon as
no lease is open; new leases are refused meanwhile.

Requests, one JSON line each on a connection, answered with one JSON line:
  {"lease": true}   the manifest (as the first command got it); the
                    connection is a lease until it closes.
  {"status": true}  what `kernelsearch cache kept` shows.
  {"stop": true}    {"stopping": true, "leases": N}.

Integrity. Nothing may write the kept tensors: the evaluator stages copies of
them for candidates, which never see this memory. So that a bug cannot carry
a changed reference from one command into the next, every kept tensor's
fingerprint is taken before the first lease and again whenever the last open
lease ends; a difference means the bridge stops serving (its socket goes) and
exits, and the next command computes the reference afresh.

Registration. The socket's path is the registration, one per reference key
(the caller names it). A socket left by a dead bridge is replaced; one that a
live bridge answers is left alone: this bridge then serves only its own
command and does not stay.
"""

import errno
import fcntl
import json
import os
import selectors
import socket
import sys
import time

MAX_REQUEST_BYTES = 4096


def _log(message):
    sys.stderr.write("kept reference (pid %d): %s\n" % (os.getpid(), message))
    sys.stderr.flush()


def claim(path):
    """Binds the Unix socket at `path` (mode 0600, in the caller's 0700
    directory). Returns (listener, None), or (None, why) when a live bridge
    already serves `path` or it cannot be bound."""
    lock_path = path + ".lock"
    try:
        lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        return None, "cannot open %s: %s" % (lock_path, e.strerror)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
                return None, "another kept reference of this problem is alive (%s)" % path
            except OSError:
                os.unlink(path)  # a dead bridge's socket
            finally:
                probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(path)
        except OSError as e:
            listener.close()
            return None, "cannot bind %s: %s" % (path, e.strerror)
        finally:
            os.umask(old)
        listener.listen(16)
        listener.setblocking(False)
        return listener, None
    finally:
        os.close(lock_fd)


class Keeper:
    """The serving loop of a kept reference. `manifest` is the answer to a
    lease (a dict); `fingerprint()` returns the kept tensors' fingerprints
    (compared for equality); `lease_fd` is the first command's lease (stdin),
    or None; `gpu_bytes()` the GPU memory the process holds."""

    def __init__(self, listener, path, keep_s, fingerprint, lease_fd=None, gpu_bytes=lambda: 0, manifest=None):
        self.listener = listener
        self.path = path
        self.keep_s = float(keep_s)
        self.manifest_line, self.problem, self.pci_bus_id = b"", "", ""
        if manifest is not None:
            self.answer_with(manifest)
        self.fingerprint = fingerprint
        self.gpu_bytes = gpu_bytes
        self.baseline = fingerprint()
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ, ("listener", None))
        self.conns = {}  # socket -> {"buf": bytes, "lease": bool}
        self.first_lease = lease_fd
        if lease_fd is not None:
            self.sel.register(lease_fd, selectors.EVENT_READ, ("first", None))
        self.leases = 1 if lease_fd is not None else 0
        self.served = self.leases
        self.stopping = False
        self.broken = None
        self.started = time.time()
        self.idle_since = time.monotonic()

    def answer_with(self, manifest):
        """The manifest a lease gets (the first command's answer)."""
        self.manifest_line = (json.dumps(manifest, allow_nan=False) + "\n").encode()
        self.problem = manifest.get("problem", "")
        self.pci_bus_id = manifest.get("pci_bus_id", "")

    # ---- the loop ----

    def serve(self):
        """Runs until no lease is open and it is stopped, broken or idle for keep_s."""
        while True:
            if self.leases == 0:
                idle = time.monotonic() - self.idle_since
                if self.stopping or self.broken or idle >= self.keep_s:
                    break
                timeout = self.keep_s - idle
            else:
                timeout = None
            for key, _ in self.sel.select(timeout):
                kind, _ = key.data
                if kind == "listener":
                    self._accept()
                elif kind == "first":
                    self._first_lease_event()
                else:
                    self._read(key.fileobj)
        self._close()
        why = self.broken or ("stopped" if self.stopping else "idle for %g s" % self.keep_s)
        _log("exiting (%s) after %d lease(s)" % (why, self.served))

    def _accept(self):
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        conn.setblocking(True)
        self.conns[conn] = {"buf": b"", "lease": False}
        self.sel.register(conn, selectors.EVENT_READ, ("conn", None))

    def _first_lease_event(self):
        try:
            data = os.read(self.first_lease, 4096)
        except OSError:
            data = b""
        if data:
            return  # the first command writes nothing; anything it does write is ignored
        self.sel.unregister(self.first_lease)
        self.first_lease = None
        self._lease_ended()

    def _read(self, conn):
        state = self.conns[conn]
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        state["buf"] += data
        while b"\n" in state["buf"]:
            line, state["buf"] = state["buf"].split(b"\n", 1)
            if not self._answer(conn, state, line):
                self._drop(conn)
                return
        if len(state["buf"]) > MAX_REQUEST_BYTES:
            self._send(conn, {"error": "a request longer than %d bytes" % MAX_REQUEST_BYTES})
            self._drop(conn)

    def _send(self, conn, obj_or_bytes):
        data = obj_or_bytes if isinstance(obj_or_bytes, bytes) else (json.dumps(obj_or_bytes) + "\n").encode()
        try:
            conn.sendall(data)
            return True
        except OSError:
            return False

    def _answer(self, conn, state, line):
        """Answers one request; False drops the connection."""
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("not an object")
        except ValueError as e:
            self._send(conn, {"error": "a request that is not a JSON object: %s" % e})
            return False
        if req.get("lease"):
            if state["lease"]:
                return self._send(conn, {"error": "this connection holds a lease already"})
            if self.stopping or self.broken:
                self._send(conn, {"error": "the kept reference is %s" % ("stopping" if self.stopping else "broken")})
                return False
            if not self._send(conn, self.manifest_line):
                return False
            state["lease"] = True
            self.leases += 1
            self.served += 1
            return True
        if req.get("status"):
            return self._send(conn, self.status())
        if req.get("stop"):
            self.stopping = True
            self._unlink()  # no new command finds it
            return self._send(conn, {"stopping": True, "leases": self.leases})
        self._send(conn, {"error": "unknown request (lease, status or stop)"})
        return False

    def _drop(self, conn):
        state = self.conns.pop(conn, None)
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()
        if state and state["lease"]:
            self._lease_ended()

    def _lease_ended(self):
        self.leases -= 1
        if self.leases > 0:
            return
        self.idle_since = time.monotonic()
        if self.broken or self.stopping:
            return
        now = self.fingerprint()
        if now != self.baseline:
            changed = sum(1 for a, b in zip(now, self.baseline) if a != b) + abs(len(now) - len(self.baseline))
            self.broken = "the kept tensors changed (%d of %d differ from their fingerprints)" % (
                changed, len(self.baseline))
            _log(self.broken + "; no longer served")
            self._unlink()
        else:
            self.idle_since = time.monotonic()  # the check's time is not idle time

    # ---- status and teardown ----

    def status(self):
        idle = 0.0 if self.leases else time.monotonic() - self.idle_since
        return {"problem": self.problem, "pid": os.getpid(), "socket": self.path, "keep_s": self.keep_s,
                "leases": self.leases, "leases_served": self.served, "idle_s": round(idle, 3),
                "expires_in_s": None if self.leases else round(max(0.0, self.keep_s - idle), 3),
                "gpu_bytes": self.gpu_bytes(), "pci_bus_id": self.pci_bus_id, "started_unix": self.started,
                "stopping": self.stopping}

    def _unlink(self):
        """Removes the socket's path if it is still this listener's."""
        if self.listener is None:
            return
        try:
            if os.path.exists(self.path) and self._path_is_ours():
                os.unlink(self.path)
        except OSError as e:
            if e.errno != errno.ENOENT:
                _log("cannot remove %s: %s" % (self.path, e.strerror))
        try:
            self.sel.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.listener.close()
        self.listener = None

    def _path_is_ours(self):
        """Whether the path still names our socket (another bridge may have
        replaced a path it found dead): a connection there reaches our
        listener, seen as a pending accept."""
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.setblocking(False)
        try:
            probe.connect(self.path)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return False
        try:
            conn, _ = self.listener.accept()
            conn.close()
            return True
        except (BlockingIOError, OSError):
            return False
        finally:
            probe.close()

    def _close(self):
        self._unlink()
        for conn in list(self.conns):
            self._drop(conn)
