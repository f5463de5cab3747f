"""Record what Chromium's fake microphone sends (no file: its beeps), for the VAD's tone tests.

    unshare --net sh -c 'ip link set lo up; exec .venv/bin/python -m tests.web.record_fake_mic'

Opens the demo page's origin (a secure context for getUserMedia), captures the microphone with
the audio processing a call uses (echo cancellation, noise suppression, gain control) at
16 kHz for 60 s, and writes tests/data/chromium_fake_mic.npz (int16, key ``pcm``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from tests.support.browser import chromium
from tests.support.server_process import ROOT, ServerProcess

RECORD_JS = """async (seconds) => {
  const stream = await navigator.mediaDevices.getUserMedia({audio: {
    echoCancellation: true, noiseSuppression: true, autoGainControl: true}});
  const ctx = new AudioContext({sampleRate: 16000});
  const source = ctx.createMediaStreamSource(stream);
  const tap = ctx.createScriptProcessor(4096, 1, 1);
  const out = [];
  tap.onaudioprocess = (e) => {
    for (const v of e.inputBuffer.getChannelData(0)) out.push(Math.round(v * 32767));
  };
  source.connect(tap);
  tap.connect(ctx.destination);
  await new Promise((done) => setTimeout(done, seconds * 1000));
  tap.disconnect();
  stream.getTracks().forEach((t) => t.stop());
  return out;
}"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=ROOT / "tests/data/chromium_fake_mic.npz")
    args = parser.parse_args(argv)
    server = ServerProcess({"pipeline.factory": "", "transport.video": "false"}).start()
    try:
        with chromium(None) as browser:
            page = browser.new_context().new_page()
            page.goto(server.url)
            pcm = np.asarray(page.evaluate(RECORD_JS, args.seconds), np.int16)
    finally:
        server.stop()
    np.savez_compressed(args.out, pcm=pcm)
    print(f"{len(pcm) / 16000:.1f} s at 16 kHz -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
