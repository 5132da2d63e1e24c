"""conftest.refused_in_subprocess, which the GPU tests use for the CUDA ops' argument checks, on
CPU ops: it passes a matching refusal and fails on a wrong message, on no error and on a crash."""
import pytest

from conftest import refused_in_subprocess

BAD_PACK = "ops.split12_pack(torch.zeros(4, 8))"          # a CPU op: float32 is refused


def test_matching_refusal_passes():
    refused_in_subprocess("", [(BAD_PACK, "must be bfloat16")])


@pytest.mark.parametrize("cases,reason", [
    ([(BAD_PACK, "no such words")], "wrong message"),
    ([("x = 1", "anything")], "no error"),
    ([(BAD_PACK, "must be bfloat16"), ("__import__('os').kill(__import__('os').getpid(), 11)", "x")],
     "process died"),
])
def test_each_failure_is_reported(cases, reason):
    with pytest.raises(AssertionError, match=reason):
        refused_in_subprocess("", cases)
