// The Tools panel: two tools the avatar may call (OpenAI Realtime GA function calling), run
// here in the page. `set_lamp` colours the lamp drawn in the panel, `start_timer` starts a
// countdown. Off by default: nothing is sent until "Let the avatar use tools" is ticked.
//
// With it on, the page declares the tools (`session.update` with `session.tools`). When a reply
// calls one, the server sends `response.function_call_arguments.done` ({response_id, item_id,
// call_id, name, arguments}): the page runs the tool, shows the call, and answers with a
// `function_call_output` item, then `response.create` once the reply that made the call is done
// (at once if it is already; none if a barge-in cancelled it: the output stays in the history
// and the user's own turn gets the next reply). A call is run once, even if a resumed
// connection delivers its event again.

export const LAMP_COLOURS = ['red', 'orange', 'yellow', 'green', 'blue', 'purple', 'white', 'off'];

/** The tools as `session.tools` declares them (GA function tools with a JSON schema). */
export const TOOLS = [
  {
    type: 'function',
    name: 'set_lamp',
    description: "Set the colour of the lamp in the user's room, or switch it off.",
    parameters: {
      type: 'object',
      properties: {
        colour: { type: 'string', enum: LAMP_COLOURS, description: 'The new colour, or "off".' },
      },
      required: ['colour'],
      additionalProperties: false,
    },
  },
  {
    type: 'function',
    name: 'start_timer',
    description: 'Start a countdown timer for the user.',
    parameters: {
      type: 'object',
      properties: {
        minutes: { type: 'integer', minimum: 1, maximum: 60, description: 'How long, in minutes.' },
        label: { type: 'string', description: 'What the timer is for (optional), e.g. "tea".' },
      },
      required: ['minutes'],
      additionalProperties: false,
    },
  },
];

const TICK_MS = 250;
const MAX_SHOWN_CALLS = 6;

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text != null) node.textContent = text;
  return node;
}

/** `{name: value}` as `name: "value"`, for a one-line view of a call's arguments. */
function showArgs(args) {
  if (!args || typeof args !== 'object') return String(args);
  return Object.entries(args)
    .map(([k, v]) => `${k}: ${JSON.stringify(v)}`)
    .join(', ');
}

function clock(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

export class ToolsPanel {
  /**
   * `ui`: {enabled (checkbox), lamp, lampText, timer, timerLabel, calls (a list), conversation
   * (the transcript's list)}; `send(event)`: sends a client event, false when not connected.
   */
  constructor(ui, send) {
    this.ui = ui;
    this.send = send;
    this.lamp = 'off';
    this.timer = null; // {endsAt (Date.now() ms), minutes, label}
    this.ticker = null;
    this.calls = []; // every call run: {call_id, name, args, output, ok, at}
    this.handled = new Set(); // call ids already run
    this.active = new Set(); // response ids created and not yet done
    this.waiting = new Map(); // response id -> call ids whose output waits for its response.done
    this.interrupted = new Set(); // response ids that ended cancelled (a barge-in)
    ui.enabled.addEventListener('change', () => this.declare());
    this.showLamp();
  }

  get enabled() {
    return this.ui.enabled.checked;
  }

  /** Declare the tools to the session (or withdraw them); false when not connected. */
  declare() {
    const session = this.enabled ? { type: 'realtime', tools: TOOLS, tool_choice: 'auto' } : { type: 'realtime', tools: [] };
    return this.send({ type: 'session.update', session });
  }

  /** Every server event of the call, after the page has handled it. */
  onEvent(event) {
    switch (event.type) {
      case 'x-avatar.session':
        // a new conversation: declare the tools (a resumed one keeps its session)
        if (!event.resumed && this.enabled) this.declare();
        break;
      case 'response.created':
        if (event.response && event.response.id) this.active.add(event.response.id);
        break;
      case 'response.function_call_arguments.done':
        this.handle(event);
        break;
      case 'response.done':
        this.responseDone(event.response || {});
        break;
      default:
        break;
    }
  }

  /**
   * A GA `response.function_call_arguments.done`: run the tool, show it, send its output,
   * then ask for the reply that speaks from it. Returns the call's record (null: not run).
   */
  handle(event) {
    const callId = event.call_id;
    if (!callId || this.handled.has(callId)) return null;
    this.handled.add(callId);
    let args = null;
    let result;
    try {
      args = JSON.parse(event.arguments || '{}');
      result = this.run(event.name, args);
    } catch (err) {
      result = { error: err instanceof SyntaxError ? 'the arguments are not JSON' : err.message };
    }
    const record = {
      call_id: callId,
      name: event.name,
      args,
      output: JSON.stringify(result),
      ok: !result.error,
      response_id: event.response_id || null,
      at: Date.now(),
    };
    this.calls.push(record);
    this.showCall(record);
    this.send({ type: 'conversation.item.create', item: { type: 'function_call_output', call_id: callId, output: record.output } });
    const responseId = event.response_id;
    if (responseId && this.interrupted.has(responseId)) return record; // kept, starts no reply
    if (responseId && this.active.has(responseId)) {
      // the reply that made the call is still open: answer once it is done
      if (!this.waiting.has(responseId)) this.waiting.set(responseId, []);
      this.waiting.get(responseId).push(callId);
    } else {
      this.send({ type: 'response.create' });
    }
    return record;
  }

  responseDone(response) {
    const id = response.id;
    this.active.delete(id);
    const calls = this.waiting.get(id);
    this.waiting.delete(id);
    if (response.status === 'cancelled') this.interrupted.add(id);
    else if (calls && calls.length) this.send({ type: 'response.create' });
    const bubble = this.bubble(id);
    if (bubble && bubble.querySelector('.tool-call') && !bubble.querySelector('.chunk')) {
      // a reply that only called a tool said nothing: not "stopped before speaking"
      bubble.querySelectorAll('.text > .muted').forEach((m) => m.remove());
    }
  }

  /** The tool `name` with `args`: its result (an object; `error` when it could not run). */
  run(name, args) {
    if (!this.enabled) return { error: 'the user has switched tools off' }; // unticked meanwhile
    if (name === 'set_lamp') {
      if (!LAMP_COLOURS.includes(args.colour)) return { error: `unknown colour ${JSON.stringify(args.colour)}` };
      this.lamp = args.colour;
      this.showLamp();
      return { ok: true, lamp: this.lamp };
    }
    if (name === 'start_timer') {
      const { minutes } = args;
      if (!Number.isInteger(minutes) || minutes < 1 || minutes > 60) return { error: 'minutes must be a whole number from 1 to 60' };
      const label = typeof args.label === 'string' ? args.label.trim().slice(0, 60) : '';
      const endsAt = Date.now() + minutes * 60_000;
      this.timer = { endsAt, minutes, label };
      clearInterval(this.ticker);
      this.ticker = setInterval(() => this.showTimer(), TICK_MS);
      this.showTimer();
      const ends = new Date(endsAt).toTimeString().slice(0, 5);
      return { ok: true, minutes, label: label || null, ends_at: ends };
    }
    return { error: `no tool called ${JSON.stringify(name)}` };
  }

  /** The call ended (Stop, or the call was lost): forget what was pending. The lamp and the
   * timer stay as they are. */
  reset() {
    this.active.clear();
    this.waiting.clear();
    this.interrupted.clear();
  }

  // --- what the panel shows ----------------------------------------------------------------
  showLamp() {
    const { lamp, lampText } = this.ui;
    lamp.dataset.colour = this.lamp;
    lamp.setAttribute('aria-label', `Lamp: ${this.lamp}`);
    lampText.textContent = this.lamp === 'off' ? 'Lamp off' : `Lamp ${this.lamp}`;
  }

  showTimer() {
    const { timer, timerLabel } = this.ui;
    if (!this.timer) {
      timer.textContent = '–:––';
      timer.dataset.state = 'idle';
      timerLabel.textContent = 'No timer';
      return;
    }
    const left = this.timer.endsAt - Date.now();
    timer.textContent = clock(left);
    timer.dataset.state = left > 0 ? 'running' : 'done';
    const what = this.timer.label || `${this.timer.minutes} min timer`;
    timerLabel.textContent = left > 0 ? what : `${what}: time's up`;
    if (left <= 0) clearInterval(this.ticker);
  }

  showCall(record) {
    const line = `${record.name}(${showArgs(record.args)})`;
    // the panel's list of the last calls
    const item = el('li', record.ok ? 'ok' : 'failed');
    item.dataset.tool = record.name;
    item.dataset.callId = record.call_id;
    item.append(el('code', null, line), el('span', 'result', record.ok ? '✓' : `✗ ${JSON.parse(record.output).error}`));
    this.ui.calls.prepend(item);
    while (this.ui.calls.childElementCount > MAX_SHOWN_CALLS) this.ui.calls.lastElementChild.remove();
    // a line in the transcript: in the bubble of the reply that made the call, else on its own
    const shown = el('span', 'tool-call', `Used ${line}${record.ok ? '' : ' (failed)'}`);
    shown.dataset.tool = record.name;
    shown.dataset.callId = record.call_id;
    const bubble = this.bubble(record.response_id);
    if (bubble) {
      const dots = bubble.querySelector('.thinking');
      if (dots) dots.remove();
      bubble.querySelector('.text').append(shown);
      return;
    }
    const list = this.ui.conversation;
    const empty = list.querySelector('.empty');
    if (empty) empty.remove();
    const note = el('li', 'note tool');
    note.append(shown);
    list.append(note);
    list.scrollTop = list.scrollHeight;
  }

  bubble(responseId) {
    if (!responseId) return null;
    const found = [...this.ui.conversation.querySelectorAll('.msg.agent')];
    return found.find((m) => m.dataset.responseId === String(responseId)) || null;
  }
}
