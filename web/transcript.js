// The conversation view: the user's words (partial, then final), the avatar's words as they are
// spoken, and what a barge-in dropped (struck through).

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text != null) node.textContent = text;
  return node;
}

function remainderOf(text, heard) {
  if (text.startsWith(heard)) return text.slice(heard.length);
  const heardWords = heard.split(/\s+/).filter(Boolean).length;
  const words = text.split(/(\s+)/); // keeps the spaces
  let seen = 0;
  let cut = 0;
  for (let i = 0; i < words.length && seen < heardWords; i += 1) {
    if (words[i].trim()) seen += 1;
    cut = i + 1;
  }
  return words.slice(cut).join('');
}

export class Conversation {
  constructor(list) {
    this.list = list;
    this.userItem = null; // the user turn being heard
    this.agentItems = new Map(); // response id -> <li> of that reply
    this.chunks = new Map(); // chunk id (the page's own, unique) -> <span>
  }

  _append(item) {
    const empty = this.list.querySelector('.empty');
    if (empty) empty.remove();
    const scroller = this.list;
    const atBottom = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 40;
    this.list.append(item);
    if (atBottom) scroller.scrollTop = scroller.scrollHeight;
    return item;
  }

  _scroll() {
    this.list.scrollTop = this.list.scrollHeight;
  }

  _bubble(role, label) {
    const item = el('li', `msg ${role}`);
    item.append(el('span', 'who', label), el('p', 'text'));
    return this._append(item);
  }

  /** The user started speaking: a bubble that fills with partial transcripts. */
  speechStarted() {
    if (this.userItem && this.userItem.dataset.state === 'listening') return;
    this.userItem = this._bubble('user', 'You');
    this.userItem.dataset.state = 'listening';
    this.userItem.querySelector('.text').append(el('span', 'dots', '…'));
  }

  /** A partial transcript: `stable` (agreed words) shown firmly, the rest faint. */
  partial(transcript, stable) {
    if (!this.userItem) this.speechStarted();
    const text = this.userItem.querySelector('.text');
    const firm = stable && transcript.startsWith(stable) ? stable : '';
    text.replaceChildren(el('span', 'stable', firm), el('span', 'unstable', transcript.slice(firm.length)));
    this.userItem.dataset.state = 'partial';
    this._scroll();
  }

  /** The final transcript of the user's turn ("" removes the bubble: nothing was said). */
  final(transcript) {
    const item = this.userItem;
    this.userItem = null;
    if (!transcript) {
      if (item) item.remove();
      return;
    }
    const target = item || this._bubble('user', 'You');
    target.querySelector('.text').textContent = transcript;
    target.dataset.state = 'final';
    this._scroll();
  }

  typed(text) {
    const item = this._bubble('user typed', 'You (typed)');
    item.querySelector('.text').textContent = text;
    item.dataset.state = 'final';
    this._scroll();
  }

  /** A new reply, `responseId` (`response.created`). */
  responseCreated(responseId) {
    const item = this._bubble('agent', 'Avatar');
    item.dataset.responseId = String(responseId);
    item.dataset.state = 'thinking';
    item.querySelector('.text').append(el('span', 'dots thinking', '…'));
    this.agentItems.set(responseId, item);
  }

  /** A chunk's text arrived; it stays hidden until its audio plays. */
  chunk(responseId, id, text) {
    if (!this.agentItems.has(responseId)) this.responseCreated(responseId);
    const span = el('span', 'chunk', `${text} `);
    span.dataset.chunkId = String(id);
    span.dataset.state = 'queued';
    this.agentItems.get(responseId).querySelector('.text').append(span);
    this.chunks.set(id, span);
  }

  /** The chunk's audio started playing. */
  spoken(id) {
    const span = this.chunks.get(id);
    if (!span || span.dataset.state !== 'queued') return;
    const item = span.closest('.msg');
    item.querySelectorAll('.chunk[data-state="playing"]').forEach((c) => {
      c.dataset.state = 'spoken';
    });
    span.dataset.state = 'playing';
    item.dataset.state = 'speaking';
    const dots = item.querySelector('.thinking');
    if (dots) dots.remove();
    this._scroll();
  }

  /**
   * The reply `responseId` was cut and `heard` (the server's transcript of the assistant item:
   * the chunks played, in order, then the played words of the one cut) is what the user
   * heard. Chunks heard in full are spoken, the cut one shows its heard words and the rest
   * struck through, later ones are dropped. `cutSeen`: the server said the item was truncated
   * (then the first chunk not heard in full is the cut one, even with no word of it heard).
   */
  cut(responseId, heard, cutSeen) {
    const item = this.agentItems.get(responseId);
    if (!item) return;
    let rest = heard.replace(/\s+/g, ' ').trim();
    let cutDone = false;
    for (const span of item.querySelectorAll('.chunk')) {
      if (span.dataset.state === 'truncated' || span.dataset.state === 'dropped') continue;
      const text = span.textContent.replace(/\s+/g, ' ').trim();
      if (!cutDone && text && (rest === text || rest.startsWith(`${text} `))) {
        rest = rest.slice(text.length).trim();
        span.dataset.state = 'spoken';
      } else if (!cutDone && (rest || cutSeen || span.dataset.state === 'playing')) {
        this.truncated(Number(span.dataset.chunkId), rest);
        cutDone = true;
      } else {
        this.dropped([Number(span.dataset.chunkId)]);
      }
    }
    this._scroll();
  }

  /** A barge-in cut chunk `id` after `heardText`: the rest is shown struck through. */
  truncated(id, heardText) {
    const span = this.chunks.get(id);
    if (!span) return;
    const text = span.textContent.trim();
    const rest = remainderOf(text, heardText);
    span.replaceChildren(el('span', 'heard', heardText), el('del', 'dropped', rest ? ` ${rest.trim()}` : ''));
    span.appendChild(document.createTextNode(' '));
    span.dataset.state = 'truncated';
    // what played before it was heard in full
    let prev = span.previousElementSibling;
    for (; prev; prev = prev.previousElementSibling) {
      if (prev.classList.contains('chunk') && prev.dataset.state !== 'truncated') prev.dataset.state = 'spoken';
    }
    this._scroll();
  }

  /** Chunks that were never played: shown struck through and faded. */
  dropped(ids) {
    for (const id of ids) {
      const span = this.chunks.get(id);
      if (!span || span.dataset.state === 'truncated') continue;
      const text = span.textContent;
      span.replaceChildren(el('del', 'dropped', text.trim()), document.createTextNode(' '));
      span.dataset.state = 'dropped';
    }
  }

  /** Every chunk of the reply `responseId` that never played: dropped. */
  dropQueued(responseId) {
    const item = this.agentItems.get(responseId);
    if (!item) return;
    const queued = item.querySelectorAll('.chunk[data-state="queued"]');
    this.dropped([...queued].map((span) => Number(span.dataset.chunkId)));
  }

  /** The reply ended: `status` completed (all heard), cancelled or failed. */
  responseDone(responseId, status, heardIds = []) {
    const item = this.agentItems.get(responseId);
    if (!item) return;
    for (const id of heardIds) {
      const span = this.chunks.get(id);
      if (span && span.dataset.state === 'queued') span.dataset.state = 'spoken';
    }
    item.querySelectorAll('.chunk[data-state="playing"]').forEach((c) => {
      c.dataset.state = 'spoken';
    });
    const dots = item.querySelector('.thinking');
    if (dots) dots.remove();
    item.dataset.state = status;
    if (status !== 'completed') {
      item.querySelector('.who').textContent = status === 'cancelled' ? 'Avatar (interrupted)' : 'Avatar (failed)';
    }
    if (!item.querySelector('.chunk')) {
      item.querySelector('.text').append(el('span', 'muted', status === 'failed' ? 'No answer.' : '(stopped before speaking)'));
    }
    this._scroll();
  }

  notice(text, kind = 'info') {
    const item = el('li', `note ${kind}`, text);
    this._append(item);
    this._scroll();
  }
}
