"""benchmarks/audio_loss_bench.py: a quick run, on the real recogniser, encoders and decoders."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.audio_loss_bench import main


def test_a_quick_run_hears_each_way_and_counts_what_the_decoder_made(tmp_path: Path) -> None:
    out = tmp_path / "audio_loss.json"
    assert main(["--quick", "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["machine"]["cpu_model"] and found["commit"]
    mic, voice = found["mic"]["rates"], found["voice"]["rates"]
    ways = {"fec/silence", "fec/decoder", "plain/silence", "plain/decoder"}
    assert set(mic) == set(voice) == {"0.00", "0.10"} and set(mic["0.10"]) == ways
    assert set(voice["0.10"]) == {"aiortc/decoder", "speech/decoder"}
    lossless, lossy = mic["0.00"], mic["0.10"]
    assert all(row["lost_frames"] == 0 for row in lossless.values())
    assert lossless["fec/decoder"]["made"] == {"recovered": 0, "extrapolated": 0}
    made = lossy["fec/decoder"]["made"]
    # every lost frame but those at a clip's ends (no packet before or after them)
    assert lossy["fec/decoder"]["lost_frames"] >= made["recovered"] + made["extrapolated"] > 0
    assert made["recovered"] > 0  # speech from a FEC sender: copies in the next packets
    assert lossy["plain/decoder"]["made"]["recovered"] == 0  # no copies to recover from
    assert voice["0.10"]["speech/decoder"]["made"]["recovered"] > 0
    assert voice["0.10"]["aiortc/decoder"]["made"]["recovered"] == 0  # aiortc sends none
    assert 0 <= lossy["fec/decoder"]["wer"] <= 1
    rates = found["voice"]["kbps"]
    assert rates["speech"] < rates["aiortc"] / 1.5  # mono speech against stereo music
    assert set(found["us_per_packet_p50"]) == {
        "decode/server",
        "decode/aiortc",
        "encode/aiortc",
        "encode/speech",
    }
