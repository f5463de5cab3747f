// Sound level of a media track, read from a WebAudio analyser (RMS of the last ~21 ms).

export class LevelMeter {
  /** `context`: a running AudioContext; `track`: an audio MediaStreamTrack. */
  constructor(context, track) {
    this._source = context.createMediaStreamSource(new MediaStream([track]));
    this._analyser = context.createAnalyser();
    this._analyser.fftSize = 1024; // 21 ms at 48 kHz
    this._buffer = new Float32Array(this._analyser.fftSize);
    this._source.connect(this._analyser); // not to the speakers: the <video> element plays it
  }

  /** RMS level, 0..1 of full scale. */
  level() {
    this._analyser.getFloatTimeDomainData(this._buffer);
    let sum = 0;
    for (let i = 0; i < this._buffer.length; i += 1) sum += this._buffer[i] * this._buffer[i];
    return Math.sqrt(sum / this._buffer.length);
  }

  close() {
    this._source.disconnect();
  }
}

/**
 * Whether a level means sound, with a short hangover so that the gaps between syllables do not
 * count as silence. Times in ms.
 */
export class VoiceActivity {
  constructor(threshold = 0.01, hangoverMs = 150) {
    this.threshold = threshold;
    this.hangoverMs = hangoverMs;
    this.active = false;
    this.lastLoudMs = -Infinity;
    this.startedMs = null; // when the current stretch of sound began
    this.endedMs = null; // when the last stretch of sound ended (its last loud sample)
  }

  /** Feed one level reading at `nowMs`; returns 'start', 'end' or null. */
  update(level, nowMs) {
    if (level >= this.threshold) {
      this.lastLoudMs = nowMs;
      if (!this.active) {
        this.active = true;
        this.startedMs = nowMs;
        return 'start';
      }
    } else if (this.active && nowMs - this.lastLoudMs >= this.hangoverMs) {
      this.active = false;
      this.endedMs = this.lastLoudMs;
      return 'end';
    }
    return null;
  }
}
