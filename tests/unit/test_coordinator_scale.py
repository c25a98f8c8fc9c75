"""The coordinator scale bench's core at a tiny size (bench/coordinator_scale.py).

2 labs x 20 trajectories x 2 rounds through the real round driver, journal and GSM8K verifier: the
journal must hold exactly the trajectories the labs submitted, and the reported numbers must be
consistent with each other (no assertion on how fast anything is).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "coordinator_scale.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("coordinator_scale", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_tiny_run_journals_exactly_the_submitted_trajectories_and_sane_numbers(bench, tmp_path: Path) -> None:
    import hacfed.envelope
    import hacfed.server.replies as replies
    from hacfed.wire import MAX_MESSAGE_BYTES

    original_decode = replies.decode_submission
    cfg = bench.ScaleConfig(labs=2, prompts=5, group_size=4, rounds=2, correct_fraction=0.4, nonplain_fraction=0.2)
    point = bench.run_point(cfg, tmp_path / "run", isolate=False)

    submitted = bench.submitted_ids(tmp_path / "run", cfg)
    assert len(submitted) == len(set(submitted)) == 2 * 20 * 2
    assert point["journal_ids_sha"] == hashlib.sha256("\n".join(submitted).encode("utf-8")).hexdigest()
    assert point["journal_counts"] == {"submissions": 4, "trajectories": 80, "rejections": 0, "strikes": 0}
    assert point["sandbox_calls"] > 0  # some answers went to math-verify, the rest took the numeric fast path

    total = point["round_total_s"]
    assert total > 0 and point["round_cpu_s"] > 0
    assert all(v >= 0 for v in point["phases_s"].values()) and set(point["phases_s"]) == set(bench.PHASES)
    assert point["phases_s"]["decode"] > 0 and point["phases_s"]["reward"] > 0 and point["phases_s"]["journal"] > 0
    assert point["phases_s"]["pool"] > 0  # round 1 built and signed round 0's pool
    assert sum(point["phases_s"].values()) == pytest.approx(total, rel=0.05, abs=0.01)  # exclusive times add up
    assert point["us_per_trajectory"] == pytest.approx(total / 40 * 1e6)
    assert 0 < point["update_mib"] * 2**20 < MAX_MESSAGE_BYTES and not point["update_over_cap"]
    assert point["rss_peak_mib"] >= point["rss_baseline_mib"] > 0

    # the bench's timers and its lifted size cap are gone once it returns
    assert replies.decode_submission is original_decode
    assert hacfed.envelope.seal.__kwdefaults__["max_bytes"] == MAX_MESSAGE_BYTES

    double = dict(point, config=dict(point["config"], labs=4), round_total_s=2 * total,
                  us_per_trajectory=point["us_per_trajectory"], rss_growth_mib_per_lab=point["rss_growth_mib_per_lab"])
    (ratio,) = bench.growth([point, double])
    assert ratio["labs_ratio"] == 2 and ratio["time_ratio"] == pytest.approx(2) and ratio["us_per_trajectory_ratio"] == 1


def test_bad_sizes_are_refused_with_the_name_of_the_setting(bench) -> None:
    with pytest.raises(ValueError, match="ScaleConfig.labs"):
        bench.ScaleConfig(labs=0)
    with pytest.raises(ValueError, match="ScaleConfig.rounds"):
        bench.ScaleConfig(labs=2, rounds=1)
    assert bench.main(["--labs", "4,x"]) == 2
