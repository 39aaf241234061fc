"""benchmarks/checkout_kernels.py: an A/B of two checkouts' kernels times what it says, or
refuses to run."""
import importlib.util
import pathlib

import pytest

from inflight.kernels.cpu.isa import current_level

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
REPO = BENCHMARKS.parent


def checkout_kernels():
    spec = importlib.util.spec_from_file_location("checkout_kernels", BENCHMARKS / "checkout_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_refuses_when_this_kernel_would_come_from_another_checkout(monkeypatch, tmp_path):
    """A script run from one worktree that imports another checkout's inflight would time
    that checkout's kernel as "this": it must stop and say which PYTHONPATH to set."""
    ck = checkout_kernels()
    monkeypatch.setattr(ck, "this_checkout", lambda: str(tmp_path / "other-checkout"))
    with pytest.raises(SystemExit, match=f"PYTHONPATH={REPO}"):
        ck.load_from_checkout(str(REPO), "fused_ops")


@pytest.mark.skipif(current_level() is None, reason="no C kernels on this machine")
def test_builds_a_checkouts_kernel_when_this_checkout_is_imported():
    ck = checkout_kernels()
    assert pathlib.Path(ck.this_checkout()).resolve() == REPO
    assert ck.load_from_checkout(str(REPO), "fused_ops").add_rmsnorm_f32 is not None
