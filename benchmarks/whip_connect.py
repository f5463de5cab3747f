"""WHIP connect time: milliseconds from sending the ``POST /whip`` to ``connected``.

    .venv/bin/python -m benchmarks.whip_connect [--count 10] [--quick] [--out PATH]

The figure docs/clients.md quotes (median, POST -> ``connected``), for two
WebRTC stacks and two ways of sending candidates, against a real server process (the tone
reply pipeline of tests/support: no models) on loopback:

- ``aiortc``: the project's client (``client.cli.ClientPeer``: its peer connection, ``events``
  data channel and microphone track; ``close()`` DELETEs the resource). The benchmark does the
  WHIP exchange itself, as tests/server/http/test_whip.py does, because
  ``ClientPeer.connect`` neither exposes the moment of its POST nor waits for ``connected``
  (it waits for the data channel).
  ``full``: the offer carries every candidate. ``trickle``: the offer goes without candidates;
  after the answer they follow in one PATCH (``application/trickle-ice-sdpfrag``, ``If-Match``
  the ETag), then ``a=end-of-candidates`` in a second. The clock (``time.monotonic``) starts just
  before the POST and stops in the ``connectionstatechange`` callback that sees ``connected``.
- ``gstreamer``: webrtcbin, tests/support/gst_whip_client.py under the system Python (which has
  GStreamer's ``gi`` bindings), as tests/server/test_gstreamer_whip.py runs it, without and with
  ``--trickle``. The figure is its report's ``connect_ms``: the same interval, measured by the
  client with its own monotonic clock. It stays connected for ``--gst-hold`` s, then DELETEs.

Media: one Opus audio m-line each way (aiortc also opens the ``events`` data channel), no video.
Each connect is a fresh session, closed with DELETE, and the server is back to no session
before the next. One aiortc full-offer connect warms the server up first (reported apart, not
in the figures); then the rounds interleave the four (client, mode) pairs, so load from
elsewhere on the machine falls on all of them alike.

Reported per (client, mode): every sample (ms), median, p95 by nearest rank (the max when there
are 20 samples or fewer), min, max and the failures with their errors. A table is printed; the
JSON (machine, ISA flags, commit, versions) goes to ``benchmarks/results/whip_connect.json``
(``--out``). Exit code 0 only if every connect succeeded and the server exited cleanly.
``--quick``: 2 connects per pair, a smoke run whose figures are not for reporting. Bounded: each
connect waits at most ``CONNECT_TIMEOUT_S`` (aiortc) or ``--gst-hold`` + ``GST_SLACK_S``
(GStreamer), and the server's return to no session at most ``SETTLE_TIMEOUT_S``. Runs in its own
network namespace (loopback only) where it can.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiortc import RTCSessionDescription

from benchmarks import pct, source_commit
from benchmarks.netns import isolate
from client.cli import ClientPeer, save_wav
from server.http.whip import SDPFRAG_TYPE
from server.machine import this_machine
from server.rtc.settings import pin_host_addresses
from tests.support.offers import first_mid, sdpfrag, without_candidates
from tests.support.server_process import ROOT, TONE_PIPELINE, ServerProcess
from tests.support.speech import silence

RESULT = Path("benchmarks/results/whip_connect.json")
SYSTEM_PYTHON = "/usr/bin/python3"  # has GStreamer's gi bindings; the virtualenv has none
GST_CLIENT = ROOT / "tests" / "support" / "gst_whip_client.py"
PAIRS = (("aiortc", "full"), ("aiortc", "trickle"), ("gstreamer", "full"), ("gstreamer", "trickle"))
DEFAULT_COUNT = 10
QUICK_COUNT = 2
CONNECT_TIMEOUT_S = 15.0  # one aiortc connect: POST, PATCHes and ICE + DTLS
HTTP_TIMEOUT_S = 10.0
GST_HOLD_S = 3.0  # how long the GStreamer client stays connected before its DELETE
GST_SLACK_S = 30.0  # on top of the hold: GStreamer start-up, gathering, DELETE, shutdown
SETTLE_TIMEOUT_S = 15.0  # the server back to no session after a DELETE
SDP_HEADERS = {"Content-Type": "application/sdp"}


@dataclass
class Series:
    """The connects of one (client, mode) pair."""

    client: str
    mode: str
    samples_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        s = self.samples_ms
        return {
            "client": self.client,
            "mode": self.mode,
            "connects": len(s) + len(self.errors),
            "samples_ms": s,
            "median_ms": round(statistics.median(s), 1) if s else None,
            "p95_ms": round(pct(s, 0.95), 1) if s else None,
            "min_ms": min(s) if s else None,
            "max_ms": max(s) if s else None,
            "failures": len(self.errors),
            "errors": self.errors,
        }


async def aiortc_connect(url: str, trickle: bool) -> float:
    """One WHIP session of a ``ClientPeer``: ms from the POST to ``connected``. The session is
    DELETEd (``ClientPeer.close``) whatever happens; RuntimeError/TimeoutError on a failure."""
    peer = ClientPeer(url, whip=True, video=False)
    connected_at: list[float] = []
    settled = asyncio.Event()

    def on_state() -> None:
        state = peer.pc.connectionState
        if state == "connected" and not connected_at:
            connected_at.append(time.monotonic())
        if state in ("connected", "failed", "closed"):
            settled.set()

    peer.pc.on("connectionstatechange", on_state)
    try:
        peer.pc.addTrack(peer.mic)
        await peer.pc.setLocalDescription(await peer.pc.createOffer())
        offer = peer.pc.localDescription.sdp
        candidates: list[str] = []
        ufrag = pwd = ""
        mid = first_mid(offer)
        if trickle:
            offer, candidates, ufrag, pwd = without_candidates(offer)
            if not candidates:
                raise RuntimeError("aiortc gathered no candidate")
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            started = time.monotonic()
            async with http.post(f"{url}/whip", data=offer, headers=SDP_HEADERS) as resp:
                if resp.status != 201:
                    raise RuntimeError(f"POST /whip {resp.status}: {(await resp.text())[:200]}")
                peer.location = resp.headers["Location"]
                peer.session_id = peer.location.rsplit("/", 1)[-1]
                etag = resp.headers.get("ETag", "*")
                answer = await resp.text()
            await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            if trickle:
                headers = {"Content-Type": SDPFRAG_TYPE, "If-Match": etag}
                for lines in ([f"a={c}" for c in candidates], ["a=end-of-candidates"]):
                    body = sdpfrag(ufrag, pwd, mid, lines)
                    async with http.patch(url + peer.location, data=body, headers=headers) as resp:
                        if resp.status != 204:
                            raise RuntimeError(f"PATCH {resp.status}: {(await resp.text())[:200]}")
        left = started + CONNECT_TIMEOUT_S - time.monotonic()
        try:
            await asyncio.wait_for(settled.wait(), max(0.0, left))
        except TimeoutError:
            raise TimeoutError(
                f"not connected within {CONNECT_TIMEOUT_S} s ({peer.pc.connectionState})"
            ) from None
        if not connected_at:
            raise RuntimeError(f"connection {peer.pc.connectionState}")
        return (connected_at[0] - started) * 1000
    finally:
        await peer.close()


def gst_connect(url: str, wav: Path, trickle: bool, hold_s: float) -> float:
    """One WHIP session of the GStreamer client: its report's ``connect_ms``. RuntimeError when
    it reports no connection, an error, or a DELETE that did not answer 200."""
    args = [SYSTEM_PYTHON, str(GST_CLIENT), "--url", url, "--wav", str(wav)]
    args += ["--duration", str(hold_s), "--local-ip", "127.0.0.1"]
    if trickle:
        args.append("--trickle")
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=hold_s + GST_SLACK_S, check=False
        )
    except subprocess.TimeoutExpired as exc:  # run() has killed it
        raise RuntimeError(f"GStreamer client still running after {exc.timeout} s") from None
    reports = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == "report":
                reports.append(event)
    if not reports:
        raise RuntimeError(f"no report (rc {proc.returncode}): {proc.stderr.strip()[-300:]}")
    report = reports[-1]
    if report["errors"] or report["connect_ms"] is None:
        raise RuntimeError(f"{report['connection']}: {report['errors']}")
    if report["delete_status"] != 200:
        raise RuntimeError(f"DELETE answered {report['delete_status']}")
    return float(report["connect_ms"])


def gstreamer_version() -> str:
    """The system GStreamer's version string, or why there is none."""
    probe = "import gi; gi.require_version('Gst', '1.0'); from gi.repository import Gst; "
    probe += "Gst.init(None); print(Gst.version_string())"
    try:
        found = subprocess.run(
            [SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    return found.stdout.strip() or f"unavailable: {found.stderr.strip()[-200:]}"


async def one_connect(
    server: ServerProcess, client: str, mode: str, wav: Path, hold_s: float
) -> float:
    """One connect of ``client`` in ``mode`` (ms), then the server back to no session."""
    trickle = mode == "trickle"
    try:
        if client == "aiortc":
            return await aiortc_connect(server.url, trickle)
        return await asyncio.to_thread(gst_connect, server.url, wav, trickle, hold_s)
    finally:
        await server.wait_sessions(0, SETTLE_TIMEOUT_S)


async def measure(server: ServerProcess, count: int, hold_s: float, wav: Path) -> dict[str, Any]:
    warmup: dict[str, Any] = {"client": "aiortc", "mode": "full"}
    try:
        warmup["ms"] = round(await one_connect(server, "aiortc", "full", wav, hold_s), 1)
    except (RuntimeError, TimeoutError, OSError, aiohttp.ClientError) as exc:
        warmup["error"] = f"{type(exc).__name__}: {exc}"
    print(f"warm-up (aiortc full): {warmup}", flush=True)
    series = {pair: Series(*pair) for pair in PAIRS}
    for round_ in range(count):
        for client, mode in PAIRS:
            found = series[(client, mode)]
            try:
                ms = round(await one_connect(server, client, mode, wav, hold_s), 1)
            except (RuntimeError, TimeoutError, OSError, aiohttp.ClientError) as exc:
                found.errors.append(f"{type(exc).__name__}: {exc}")
                print(f"{client:<9} {mode:<7} #{round_ + 1}: FAILED {exc}", flush=True)
                continue
            found.samples_ms.append(ms)
            print(f"{client:<9} {mode:<7} #{round_ + 1}: {ms:7.1f} ms", flush=True)
    return {
        "warmup": warmup,
        "results": {f"{c}/{m}": s.summary() for (c, m), s in series.items()},
    }


async def run(count: int, hold_s: float) -> dict[str, Any]:
    pin_host_addresses(["127.0.0.1"])
    server = ServerProcess(
        {
            "pipeline.factory": TONE_PIPELINE,
            "server.debug_endpoints": "true",
            "server.log_level": "WARNING",
            "transport.session_burst": "1000",  # 4 x count sessions from one address
        },
        env={"TONE_PIPELINE_MS": "1500", "TONE_PIPELINE_SENTENCES": "1"},
    ).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            wav = Path(tmp) / "silence.wav"  # the GStreamer client's microphone; outlasts it
            save_wav(wav, silence((hold_s + 2.0) * 1000))
            results = await measure(server, count, hold_s, wav)
    finally:
        code = server.stop()
    results["server_exit_code"] = code
    return results


def table(results: dict[str, Any]) -> str:
    """The per-pair figures as a fixed-width table (ms)."""
    lines = [f"{'client':<10}{'mode':<9}{'ok':>4}{'fail':>6}{'median':>9}{'p95':>9}{'max':>9}"]
    for row in results.values():
        cells = [row["median_ms"], row["p95_ms"], row["max_ms"]]
        figures = "".join(f"{'-' if v is None else f'{v:.1f}':>9}" for v in cells)
        ok = row["connects"] - row["failures"]
        lines.append(f"{row['client']:<10}{row['mode']:<9}{ok:>4}{row['failures']:>6}{figures}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.whip_connect", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--count", type=int, help=f"connects per pair (default {DEFAULT_COUNT})")
    parser.add_argument("--gst-hold", type=float, default=GST_HOLD_S, help="GStreamer client s")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT} connects per pair")
    parser.add_argument("--out", type=Path, default=RESULT, help="where the JSON goes")
    args = parser.parse_args(argv)
    count = args.count or (QUICK_COUNT if args.quick else DEFAULT_COUNT)
    if count < 1:
        parser.error("--count must be at least 1")
    isolate("benchmarks.whip_connect", argv)
    print(f"machine: {this_machine().describe()}", flush=True)
    started = time.monotonic()
    results: dict[str, Any] = {
        "what": "ms from sending POST /whip to connectionState connected, loopback",
        "machine": this_machine().to_dict(),
        "commit": source_commit(),
        "quick": args.quick,
        "count": count,
        "gst_hold_s": args.gst_hold,
        "media": "one Opus audio m-line (aiortc: plus the events data channel), no video",
        "versions": {
            "aiortc": importlib.metadata.version("aiortc"),
            "gstreamer": gstreamer_version(),
        },
    }
    results.update(asyncio.run(run(count, args.gst_hold)))
    results["wall_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(table(results["results"]))
    print(f"(ms, POST -> connected; p95 by nearest rank; took {results['wall_s']} s)")
    print(f"wrote {args.out}")
    failures = sum(r["failures"] for r in results["results"].values())
    failures += "error" in results["warmup"]
    if failures or results["server_exit_code"] != 0:
        print(
            f"failed: {failures} connect(s), server exit {results['server_exit_code']}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
