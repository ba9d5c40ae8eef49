from stitchcuda.verify.torch_state import TorchState, set_tf32


def test_changes_are_seen_and_restored():
    import torch

    before = TorchState.capture()
    torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
    torch.set_float32_matmul_precision("medium")
    changes = TorchState.capture().changes_since(before)
    assert set(changes) >= {"cudnn.benchmark", "float32_matmul_precision"}
    before.restore()
    assert TorchState.capture().changes_since(before) == {}


def test_set_tf32_both_ways():
    import torch

    before = TorchState.capture()
    set_tf32(True)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    set_tf32(False)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    before.restore()
