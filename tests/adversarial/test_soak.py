"""A short soak: faulty and honest candidates on two workers of one device, nothing lost or raised (on the CPU in CI;
two workers of one GPU with KB_GYM_ADVERSARIAL_DEVICE, device.py)."""

from __future__ import annotations

from device import DEVICE

from kb_gym.soak import format_soak, run_soak


def test_short_soak_on_two_workers_loses_nothing(tmp_path):
    out = tmp_path / "soak.json"
    stats = run_soak(n=16, fault_rate=0.5, device=f"{DEVICE},{DEVICE}", seed=3, max_minutes=5, out=str(out))
    assert stats["n"] == 16 and stats["workers"] == 2
    assert sum(stats["faults"].values()) >= 4
    assert stats["evaluator_exceptions"] == 0 and stats["lost_results"] == 0
    assert sum(stats["statuses"].values()) == 16 and stats["statuses"].get("correct", 0) >= 4
    assert stats["samples"][-1]["evaluator_rss_mb"] > 0 and out.exists()
    assert "lost results: 0 of 16" in format_soak(stats)
