"""The WHIP connect benchmark: its pure parts, and a one-connect-per-pair run that must pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.netns import MARK
from benchmarks.whip_connect import PAIRS, Series, main, table
from tests.support.offers import sdpfrag, without_candidates

OFFER = (
    "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\na=ice-ufrag:EsAw\r\na=ice-pwd:secret\r\n"
    "a=candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host\r\na=end-of-candidates\r\n"
    "m=application 9 DTLS/SCTP 5000\r\na=mid:1\r\na=ice-ufrag:EsAw\r\na=ice-pwd:secret\r\n"
    "a=candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host\r\na=end-of-candidates\r\n"
)


def test_the_trickled_offer_keeps_no_candidate_and_the_fragment_carries_them() -> None:
    offer, candidates, ufrag, pwd = without_candidates(OFFER)
    assert "a=candidate:" not in offer and "a=end-of-candidates" not in offer
    assert offer.count("m=") == 2 and offer.endswith("\r\n")
    assert candidates == ["candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host"]
    assert (ufrag, pwd) == ("EsAw", "secret")
    fragment = sdpfrag(ufrag, pwd, "0", [f"a={candidates[0]}"])
    assert fragment.splitlines()[:2] == ["a=ice-ufrag:EsAw", "a=ice-pwd:secret"]
    assert "a=mid:0" in fragment and fragment.endswith("typ host\r\n")


def test_series_summary_and_table() -> None:
    series = Series("aiortc", "full", [30.0, 10.0, 20.0, 40.0], ["TimeoutError: slow"])
    row = series.summary()
    assert row["connects"] == 5 and row["failures"] == 1
    assert (row["median_ms"], row["p95_ms"], row["min_ms"], row["max_ms"]) == (25.0, 40, 10, 40)
    empty = Series("gstreamer", "trickle").summary()
    assert empty["median_ms"] is None and empty["connects"] == 0
    lines = table({"a": row, "b": empty}).splitlines()
    assert lines[1].split() == ["aiortc", "full", "4", "1", "25.0", "40.0", "40.0"]
    assert lines[2].split() == ["gstreamer", "trickle", "0", "0", "-", "-", "-"]


def test_one_connect_per_pair_succeeds_and_writes_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MARK, "1")  # the suite runs in its own network namespace already
    out = tmp_path / "whip_connect.json"
    assert main(["--count", "1", "--gst-hold", "1.5", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["count"] == 1 and results["server_exit_code"] == 0
    assert set(results["results"]) == {f"{c}/{m}" for c, m in PAIRS}
    for row in results["results"].values():
        assert row["failures"] == 0 and len(row["samples_ms"]) == 1
        assert 0 < row["median_ms"] < 5000
