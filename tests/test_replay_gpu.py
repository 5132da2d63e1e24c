"""AcceptanceReplay on a GPU: handing the planned drafts to the device does not wait for the step in
flight, so a replayed run times the same host-device overlap as a real one. Skipped on CPU."""
import torch

from conftest import requires_gpu
from specpilot.engine.replay import AcceptanceReplay

pytestmark = requires_gpu


def test_planned_drafts_reach_the_device_without_a_sync():
    replay = AcceptanceReplay(list(range(100, 140)), 3.5)
    drafted = torch.zeros(1, 7, dtype=torch.long, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        planned = replay.step_drafts(0, 0, drafted, 1000)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert planned.is_cuda and planned.shape == (1, 7)
    assert planned.cpu().tolist() == [replay.planned_drafts(0, 0, 7, 1000)]
