"""
Which device and dtype a script runs on (devices.choose_device_dtype), CUDA and Apple's MPS
included. This machine has neither: what they would choose is checked with torch's answers
replaced (monkeypatch); the project has not run on Apple hardware.

    python -m pytest -q tests/test_devices.py
"""

import pytest
import torch

from nanotost import cli, devices
from nanotost import trainkit as tk


@pytest.fixture
def apple(monkeypatch):
    """A machine with an Apple silicon GPU and no CUDA."""
    monkeypatch.setattr(devices, "mps_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_picks_mps_when_there_is_no_cuda_and_runs_it_in_float32(apple):
    assert devices.choose_device_dtype("auto", "auto") == ("mps", "float32")
    assert devices.choose_device_dtype("mps", "bfloat16") == ("mps", "bfloat16")  # asked for: kept


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(devices, "mps_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert devices.choose_device_dtype("auto", "auto") == ("cuda", "bfloat16")
    monkeypatch.setattr(devices, "mps_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.choose_device_dtype("auto", "auto") == ("cpu", "float32")


@pytest.mark.parametrize("device,words", [
    ("mps", "device='mps' but this torch"),  # this machine: no Apple GPU
    ("tpu", "device must be auto, cpu, cuda, cuda:N or mps, got 'tpu'"),
])
def test_a_device_this_machine_lacks_is_one_line(monkeypatch, device, words):
    monkeypatch.setattr(devices, "mps_available", lambda: False)
    with pytest.raises(cli.UserError, match=words):
        devices.choose_device_dtype(device, "auto")

