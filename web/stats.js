// The figures the page shows and acknowledges, read from RTCPeerConnection.getStats().

/**
 * One reading: {rttMs, audio: {level, jitterMs, packetsLost, packetsReceived, playedMs},
 * video: {framesDecoded, fps, width, height}}; absent figures are null.
 * `playedMs` is the audio played out so far (ms, silence included): the output timeline the
 * server's playback cursor counts, so it is what `x-avatar.playback.ack` reports.
 */
export async function readStats(pc) {
  const out = {
    rttMs: null,
    audio: { level: null, jitterMs: null, packetsLost: null, packetsReceived: null, playedMs: null },
    video: { framesDecoded: null, fps: null, width: null, height: null },
  };
  if (!pc) return out;
  const report = await pc.getStats();
  let selectedPair = null;
  let playoutMs = null;
  const pairs = [];
  report.forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'audio') {
      out.audio.level = s.audioLevel ?? null;
      out.audio.jitterMs = s.jitter != null ? s.jitter * 1000 : null;
      out.audio.packetsLost = s.packetsLost ?? null;
      out.audio.packetsReceived = s.packetsReceived ?? null;
      if (s.totalSamplesDuration != null) out.audio.playedMs = s.totalSamplesDuration * 1000;
    } else if (s.type === 'inbound-rtp' && s.kind === 'video') {
      out.video.framesDecoded = s.framesDecoded ?? null;
      out.video.fps = s.framesPerSecond ?? null;
      out.video.width = s.frameWidth ?? null;
      out.video.height = s.frameHeight ?? null;
    } else if (s.type === 'media-playout' && s.totalSamplesDuration != null) {
      playoutMs = s.totalSamplesDuration * 1000;
    } else if (s.type === 'transport' && s.selectedCandidatePairId) {
      selectedPair = s.selectedCandidatePairId;
    } else if (s.type === 'candidate-pair') {
      pairs.push(s);
    }
  });
  if (out.audio.playedMs == null) out.audio.playedMs = playoutMs;
  const pair =
    pairs.find((p) => p.id === selectedPair) ||
    pairs.find((p) => p.nominated && p.state === 'succeeded');
  if (pair && pair.currentRoundTripTime != null) out.rttMs = pair.currentRoundTripTime * 1000;
  return out;
}
