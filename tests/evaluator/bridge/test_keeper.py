"""pytest for ks_bridge/keeper.py (issue 33, `--keep-reference`): the serving
loop of a kept resident reference, without a GPU. The kept tensors are stood
for by a fingerprint function the test controls; leases, status, stop, the
idle time-out, the integrity check after the last lease, and claiming a
socket path (a live bridge's is left alone, a dead one's replaced)."""
import json
import os
import pathlib
import socket
import sys
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "evaluator" / "reference"))
from ks_bridge.keeper import Keeper, claim  # noqa: E402

MANIFEST = {"resident": True, "problem": "p.py", "pci_bus_id": "0000:01:00.0", "sets": [{"seed": 43}]}


class Running:
    """A Keeper serving in a thread, with a first lease (a pipe) and fingerprints the test sets."""

    def __init__(self, tmp_path, keep_s=30.0, first_lease=True):
        self.path = str(tmp_path / "k.sock")
        listener, why = claim(self.path)
        assert listener is not None, why
        self.prints = [(1, 2), (3, 4)]
        self.checks = 0
        self.first_r, self.first_w = os.pipe() if first_lease else (None, None)
        self.keeper = Keeper(listener, self.path, keep_s, self.fingerprint, lease_fd=self.first_r,
                             gpu_bytes=lambda: 1234, manifest=MANIFEST)
        self.thread = threading.Thread(target=self.keeper.serve, daemon=True)
        self.thread.start()

    def fingerprint(self):
        self.checks += 1
        return list(self.prints)

    def end_first_lease(self):
        os.close(self.first_w)

    def finished(self, timeout=5.0):
        self.thread.join(timeout)
        return not self.thread.is_alive()


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    return s


def ask(s, request):
    s.sendall((json.dumps(request) + "\n").encode())
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return json.loads(data) if data else None


def status(path):
    s = connect(path)
    try:
        return ask(s, {"status": True})
    finally:
        s.close()


def test_a_lease_gets_the_manifest_and_holds_the_reference(tmp_path):
    r = Running(tmp_path, keep_s=30)
    assert status(r.path)["leases"] == 1  # the first command's (its stdin)
    r.end_first_lease()
    time.sleep(0.2)
    st = status(r.path)
    assert st["leases"] == 0 and st["expires_in_s"] > 25 and st["gpu_bytes"] == 1234
    lease = connect(r.path)
    assert ask(lease, {"lease": True}) == MANIFEST
    st = status(r.path)
    assert st["leases"] == 1 and st["leases_served"] == 2 and st["expires_in_s"] is None
    lease.close()
    time.sleep(0.2)
    assert status(r.path)["leases"] == 0
    assert r.checks >= 3  # the baseline, and after each time the last lease ended
    s = connect(r.path)
    assert ask(s, {"stop": True}) == {"stopping": True, "leases": 0}
    s.close()
    assert r.finished()
    assert not os.path.exists(r.path)


def test_it_exits_when_idle_for_its_keep_time(tmp_path):
    r = Running(tmp_path, keep_s=0.5)
    time.sleep(0.8)
    assert os.path.exists(r.path), "a lease is open: it stays past its keep time"
    r.end_first_lease()
    started = time.monotonic()
    assert r.finished(5)
    assert 0.3 < time.monotonic() - started < 3
    assert not os.path.exists(r.path)
    with pytest.raises(OSError):
        connect(r.path)


def test_stop_waits_for_open_leases_and_refuses_new_ones(tmp_path):
    r = Running(tmp_path, keep_s=30)
    r.end_first_lease()
    lease = connect(r.path)
    assert ask(lease, {"lease": True})["resident"] is True
    s = connect(r.path)
    assert ask(s, {"stop": True}) == {"stopping": True, "leases": 1}
    assert not os.path.exists(r.path), "a stopping reference is not found by new commands"
    assert ask(s, {"lease": True})["error"] == "the kept reference is stopping"
    time.sleep(0.3)
    assert r.thread.is_alive(), "the open lease keeps it"
    lease.close()
    assert r.finished()


def test_changed_tensors_end_it_after_the_last_lease(tmp_path):
    r = Running(tmp_path, keep_s=30)
    r.prints[1] = (3, 5)  # as if someone wrote the kept memory during the first command
    r.end_first_lease()
    assert r.finished()
    assert "changed (1 of 2" in r.keeper.broken
    assert not os.path.exists(r.path)


def test_bad_requests_are_answered_and_dropped(tmp_path):
    r = Running(tmp_path, keep_s=30)
    s = connect(r.path)
    assert "not a JSON object" in ask(s, ["lease"])["error"]
    assert s.recv(10) == b""  # dropped
    s = connect(r.path)
    assert "unknown request" in ask(s, {"borrow": True})["error"]
    s = connect(r.path)
    s.sendall(b"x" * 5000)
    assert "longer than 4096" in json.loads(s.recv(1000))["error"]
    assert status(r.path)["leases"] == 1, "none of these took a lease"
    r.end_first_lease()
    s = connect(r.path)
    ask(s, {"stop": True})
    assert r.finished()


def test_claim_leaves_a_live_socket_alone_and_replaces_a_dead_one(tmp_path):
    r = Running(tmp_path, keep_s=30)
    listener, why = claim(r.path)
    assert listener is None and "alive" in why
    r.end_first_lease()
    ask(connect(r.path), {"stop": True})
    assert r.finished()

    dead = str(tmp_path / "dead.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(dead)
    s.close()  # the file stays, nobody listens: a killed bridge's
    assert os.path.exists(dead)
    listener, why = claim(dead)
    assert listener is not None, why
    assert oct(os.stat(dead).st_mode & 0o777) == oct(0o600)
    listener.close()
