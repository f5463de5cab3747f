// Which chunks (sentences) of a reply have started playing.
//
// The server sends a chunk's text before its audio; the page reveals a chunk when its audio
// starts. The first chunk of a reply shows at the reply's first sound. Later chunks:
// - placed ones (their `x-avatar.viseme` events give `pts_ms`, the chunk's start on the
//   server's output timeline) show when the played time reaches their start. The played time
//   is the browser's count of audio played out (getStats totalSamplesDuration) plus an offset
//   learnt at each reply's first sound (the browser starts counting a little before the first
//   packet, and the sound reaches the page's level meter a little later);
// - others from the sound: once the current chunk has played for its estimated length
//   (characters x ms per character, learnt from replies that played out), or earlier at a pause
//   followed by sound (the gap between two sentences).
// Times are in ms. No DOM here: the view asks and renders.

const GAP_MS = 120; // silence this long then sound: likely the next sentence
const EARLY_SHARE = 0.5; // a pause counts as a boundary only after half the estimate
const PAUSE_MS = 300; // shorter silences still count as playing time
const MAX_OFFSET_MS = 1000; // a larger offset is a misreading: ignore it

export class SpeechFollower {
  constructor(msPerChar = 65, offsetMs = null) {
    this.msPerChar = msPerChar;
    this.offsetMs = offsetMs; // output timeline = played + offset (null: not learnt yet)
    this.queue = []; // [{id, text, startMs}] not yet revealed, in play order
    this.current = null; // {id, estMs, playedMs}
    this.started = false; // the reply's first sound was heard
    this.totalPlayedMs = 0;
    this.totalChars = 0;
    this._silentSinceMs = null;
    this._lastMs = null;
  }

  /** A chunk's text arrived. */
  add(id, text) {
    this.queue.push({ id, text, startMs: null });
  }

  /** The chunk's audio starts at `startMs` on the output timeline (from its visemes). */
  place(id, startMs) {
    const chunk = this.queue.find((c) => c.id === id);
    if (chunk && (chunk.startMs == null || startMs < chunk.startMs)) chunk.startMs = startMs;
  }

  /** The output timeline position being heard, from the browser's played time (or null). */
  timeline(playedMs) {
    return playedMs == null ? null : playedMs + (this.offsetMs ?? 0);
  }

  _reveal() {
    const next = this.queue.shift();
    this.totalChars += next.text.length;
    this.current = { id: next.id, estMs: Math.max(300, next.text.length * this.msPerChar), playedMs: 0 };
    return next.id;
  }

  /**
   * One reading at `nowMs`: whether the reply is `audible` and the browser's `playedMs` (null if
   * unknown). Returns the ids of chunks that started playing.
   */
  update(nowMs, audible, playedMs = null) {
    const dt = this._lastMs == null ? 0 : Math.max(0, nowMs - this._lastMs);
    this._lastMs = nowMs;
    const silentFor = this._silentSinceMs == null ? 0 : nowMs - this._silentSinceMs;
    if (audible) this._silentSinceMs = null;
    else if (this._silentSinceMs == null) this._silentSinceMs = nowMs;
    if (this.current && (audible || silentFor < PAUSE_MS)) {
      this.current.playedMs += dt;
      this.totalPlayedMs += dt;
    }
    if (!this.queue.length) return [];
    const head = this.queue[0];
    if (!this.started) {
      if (!audible) return [];
      this.started = true;
      if (head.startMs != null && playedMs != null) {
        const offset = head.startMs - playedMs;
        if (Math.abs(offset) <= MAX_OFFSET_MS) this.offsetMs = offset;
      }
      return [this._reveal()];
    }
    if (head.startMs != null && playedMs != null) {
      const revealed = [];
      const now = this.timeline(playedMs);
      while (this.queue.length && this.queue[0].startMs != null && now >= this.queue[0].startMs) {
        revealed.push(this._reveal());
      }
      return revealed;
    }
    return this._bySound(audible, silentFor);
  }

  _bySound(audible, silentFor) {
    const c = this.current;
    if (!audible) {
      if (c && silentFor >= PAUSE_MS && c.playedMs >= EARLY_SHARE * c.estMs) {
        this.current = null; // a long pause after most of it: the next sound is the next chunk
      }
      return [];
    }
    if (c == null) return [this._reveal()];
    const atPause = silentFor >= GAP_MS && c.playedMs >= EARLY_SHARE * c.estMs;
    return atPause || c.playedMs >= c.estMs ? [this._reveal()] : [];
  }

  /** The reply played out: every chunk was heard; learn the speaking rate from it. */
  finish() {
    const ids = this.queue.map((c) => c.id);
    for (const c of this.queue) this.totalChars += c.text.length;
    this.queue = [];
    this.current = null;
    if (this.totalChars > 20 && this.totalPlayedMs > 500) {
      const measured = this.totalPlayedMs / this.totalChars;
      this.msPerChar = Math.min(200, Math.max(25, 0.6 * this.msPerChar + 0.4 * measured));
    }
    return ids;
  }

  /** The reply paused at `atMs` on the output timeline for `byMs`: chunks placed from there on
   * start that much later. */
  shift(atMs, byMs) {
    for (const chunk of this.queue) {
      if (chunk.startMs != null && chunk.startMs >= atMs) chunk.startMs += byMs;
    }
  }

  /** The reply was cut: ids never revealed (they were not heard). */
  drop() {
    const ids = this.queue.map((c) => c.id);
    this.queue = [];
    this.current = null;
    return ids;
  }

  /** A fresh follower for the next reply, keeping the learnt rate and offset. */
  next() {
    return new SpeechFollower(this.msPerChar, this.offsetMs);
  }
}
