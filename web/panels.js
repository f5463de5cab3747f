// The latency panel and the event log.

export const NO_FIGURE = '–';

const BARGE_SOURCES = {
  server: 'measured by the server',
  voice: 'your voice → reply silent',
  speech_started: 'speech detected → reply silent',
  button: 'Interrupt → reply silent',
};

function fmt(value, unit, digits = 0) {
  return value == null ? NO_FIGURE : `${value.toFixed(digits)} ${unit}`;
}

/** Voice-to-voice, barge-in reaction, RTT, jitter, loss and video figures (all ms). */
export class LatencyPanel {
  /** `el`: {v2v, v2vDetail, barge, bargeDetail, rtt, jitter, lost, video, videoDetail}. */
  constructor(el) {
    this.el = el;
    this.figures = { voiceToVoiceMs: null, bargeInMs: null, bargeInSource: null };
  }

  /** `source` page: from the end of the user's voice to the reply's first sound, heard here;
   * server: from the server's end-of-turn decision to the first audio it sent. */
  voiceToVoice(ms, source) {
    this.figures.voiceToVoiceMs = ms;
    this.el.v2v.textContent = `${Math.round(ms)} ms`;
    this.el.v2v.title =
      source === 'page'
        ? 'From the end of your voice to the first sound of the reply, measured here'
        : 'Server: end of turn to first audio sent';
  }

  /** An `x-avatar.response.timings` event: the server's stage latencies after the turn ended. */
  serverTimings(t) {
    const parts = [];
    const add = (label, v) => {
      if (typeof v === 'number') parts.push(`${label} ${Math.round(v)}`);
    };
    add('ASR', t.asr_final_ms);
    add('LLM', t.llm_first_token_ms);
    add('TTS', t.first_tts_ms);
    add('sent', t.voice_to_voice_ms);
    this.el.v2vDetail.textContent = parts.length ? `server: ${parts.join(' · ')} ms` : '';
  }

  bargeIn(ms, source) {
    this.figures.bargeInMs = ms;
    this.figures.bargeInSource = source;
    this.el.barge.textContent = `${Math.round(ms)} ms`;
    this.el.bargeDetail.textContent = BARGE_SOURCES[source] || source;
  }

  /** A reading of stats.js `readStats`. */
  stats(s) {
    this.el.rtt.textContent = fmt(s.rttMs, 'ms', s.rttMs != null && s.rttMs < 10 ? 1 : 0);
    this.el.jitter.textContent = fmt(s.audio.jitterMs, 'ms', 1);
    if (s.audio.packetsLost != null) {
      const total = s.audio.packetsLost + (s.audio.packetsReceived || 0);
      const share = total ? (100 * s.audio.packetsLost) / total : 0;
      this.el.lost.textContent = `${s.audio.packetsLost} (${share.toFixed(1)}%)`;
    }
    if (s.video.framesDecoded != null) {
      this.el.video.textContent = fmt(s.video.fps, 'fps');
      this.el.videoDetail.textContent = s.video.width ? `${s.video.width}×${s.video.height}` : '';
    }
  }
}

/** The last events in and out, runs of one type folded into one line with a count. */
export class EventLog {
  constructor(list, max = 120) {
    this.list = list;
    this.max = max;
  }

  add(event, direction = 'in') {
    const last = this.list.lastElementChild;
    if (last && last.dataset.type === event.type && last.dataset.dir === direction) {
      const count = Number(last.dataset.count) + 1;
      last.dataset.count = String(count);
      last.querySelector('.count').textContent = `×${count}`;
      last.querySelector('code').textContent = JSON.stringify(event);
      return;
    }
    const item = document.createElement('li');
    item.dataset.type = event.type;
    item.dataset.dir = direction;
    item.dataset.count = '1';
    const arrow = document.createElement('span');
    arrow.className = 'dir';
    arrow.textContent = direction === 'in' ? '↓' : '↑';
    const code = document.createElement('code');
    code.textContent = JSON.stringify(event);
    const count = document.createElement('span');
    count.className = 'count';
    item.append(arrow, code, count);
    this.list.append(item);
    while (this.list.childElementCount > this.max) this.list.firstElementChild.remove();
  }
}
