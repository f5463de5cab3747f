"""benchmarks/mic_loss_bench.py: a quick run, on the real recogniser and decoders."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.mic_loss_bench import main


def test_a_quick_run_hears_each_way_and_counts_what_the_decoder_made(tmp_path: Path) -> None:
    out = tmp_path / "mic_loss.json"
    assert main(["--quick", "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["machine"]["cpu_model"] and found["commit"]
    ways = {"fec/silence", "fec/decoder", "plain/silence", "plain/decoder"}
    assert set(found["rates"]) == {"0.00", "0.10"} and set(found["rates"]["0.10"]) == ways
    lossless, lossy = found["rates"]["0.00"], found["rates"]["0.10"]
    assert all(row["lost_frames"] == 0 for row in lossless.values())
    assert lossless["fec/decoder"]["made"] == {"recovered": 0, "extrapolated": 0}
    made = lossy["fec/decoder"]["made"]
    # every lost frame but those at a clip's ends (no packet before or after them)
    assert lossy["fec/decoder"]["lost_frames"] >= made["recovered"] + made["extrapolated"] > 0
    assert made["recovered"] > 0  # speech from a FEC sender: copies in the next packets
    assert lossy["plain/decoder"]["made"]["recovered"] == 0  # no copies to recover from
    assert 0 <= lossy["fec/decoder"]["wer"] <= 1
    assert set(found["decode_us_per_packet_p50"]) == {"decoder", "aiortc"}
