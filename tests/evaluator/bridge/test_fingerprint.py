"""pytest for the resident reference's input fingerprint (ks_bridge/resident.py
_fingerprint): it must tell whether forward changed an input in place (a
value, one byte, an order), for every dtype and size, and be the same for the
same bytes, however many chunks they take."""
import pathlib
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "evaluator" / "reference"))
from ks_bridge import resident  # noqa: E402


@pytest.fixture(params=[1 << 24, 1000], ids=["one chunk", "many chunks"])
def chunk(request, monkeypatch):
    monkeypatch.setattr(resident, "CHUNK_ELEMENTS", request.param)
    monkeypatch.setattr(resident, "_WEIGHTS", {})
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.uint8, torch.bool])
@pytest.mark.parametrize("n", [3, 10001])
def test_the_same_bytes_the_same_print_any_change_another(chunk, dtype, n):
    g = torch.Generator().manual_seed(n)
    t = (torch.rand(n, generator=g) * 100).to(dtype)
    p = resident._fingerprint(t)
    assert resident._fingerprint(t.clone()) == p
    changed = t.clone()
    changed.view(-1)[n // 2] = (1 if dtype == torch.bool else 7) if changed.view(-1)[n // 2].item() == 0 else 0
    assert resident._fingerprint(changed) != p
    if n > 1 and dtype != torch.bool:
        rolled = torch.roll(t, 1)
        if not torch.equal(rolled, t):
            assert resident._fingerprint(rolled) != p


def test_a_flipped_low_bit_and_a_swap_of_two_elements_change_it(chunk):
    t = torch.arange(5000, dtype=torch.float32)
    p = resident._fingerprint(t)
    flipped = t.clone()
    flipped.view(torch.int32)[1234] ^= 1
    assert resident._fingerprint(flipped) != p
    swapped = t.clone()
    swapped[[10, 4000]] = swapped[[4000, 10]]
    assert resident._fingerprint(swapped) != p


def test_a_view_at_an_odd_byte_offset_is_read_as_bytes(chunk):
    base = torch.arange(64, dtype=torch.uint8)
    view = base[1:61]  # 60 bytes, not word-aligned
    assert resident._fingerprint(view) == resident._fingerprint(view.clone())
    assert resident._fingerprint(torch.empty(0)) == (0, 0)
