"""On a GPU machine: the template expert's GPU model finds the device it will target, by name
(``nvidia-smi``, no CUDA context in the expert's process) and by the device's properties."""

from __future__ import annotations

import pytest

from actors.experts.template import hardware

pytestmark = pytest.mark.gpu


def test_the_gpu_model_names_this_machines_device_and_its_sm_count() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    hardware._local.cache_clear()
    by_name = hardware.detect()  # CUDA not started in this process yet: the nvidia-smi path
    assert by_name.is_gpu
    props = torch.cuda.get_device_properties(0)
    known = hardware.lookup(props.name)
    if known is not None:
        assert by_name == known
    hardware._local.cache_clear()
    torch.cuda.init()
    by_props = hardware.detect()
    assert by_props.sm_count == props.multi_processor_count
    assert by_props.smem_per_block >= 48 * 1024
    hardware._local.cache_clear()
