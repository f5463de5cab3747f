// A page built on OpenAI's Agents SDK (@openai/agents-realtime, pinned in package.json) as an app
// would build it, against this server instead of OpenAI: its key (ek_...) comes from the app's
// backend (GET /key on the page's own server), its base URL is this server's.
// tests/web/test_agents_sdk.py drives it through window.agents; esbuild bundles it (scripts/setup.sh).
import {
  OpenAIRealtimeWebRTC,
  OpenAIRealtimeWebSocket,
  RealtimeAgent,
  RealtimeSession,
  tool,
} from '@openai/agents-realtime';

const RATE_HZ = 24000; // PCM16 of the WebSocket transport, both ways
const LEVEL_EVERY_MS = 20;
// ?tools=1 (tests/web/test_agents_sdk_tools.py): the agent has one tool, get_time, which the SDK
// runs here in the page when the model calls it; without it the agent has no tools.
const WITH_TOOLS = new URLSearchParams(window.location.search).get('tools') === '1';
const THE_TIME = 'It is 14:05 in the afternoon.';

// What the test reads: SDK errors, the server events (audio payloads left out), the levels
// of the audio the page plays, and a few times (performance.now(), ms).
const state = {
  errors: [],
  events: [],
  levels: [],
  history: [],
  marks: {},
  audioChunks: 0,
  interrupted: 0,
  toolRuns: [], // each run of get_time: {at, args}
};

const getTime = tool({
  name: 'get_time',
  description: 'The current local time. Call it whenever the user asks what time it is.',
  parameters: { type: 'object', properties: {}, required: [], additionalProperties: false },
  strict: true,
  async execute(args) {
    state.toolRuns.push({ at: performance.now(), args });
    return THE_TIME;
  },
});

function note(error) {
  const e = error?.error ?? error;
  const text = e instanceof Error ? `${e.name}: ${e.message}` : JSON.stringify(e);
  state.errors.push(text);
}

// An AnalyserNode on what the page plays: the RMS of each 20 ms, with its time.
function meter(context, source) {
  const analyser = context.createAnalyser();
  analyser.fftSize = 1024;
  source.connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  setInterval(() => {
    analyser.getFloatTimeDomainData(samples);
    let sum = 0;
    for (const s of samples) sum += s * s;
    state.levels.push([performance.now(), Math.sqrt(sum / samples.length)]);
    if (state.levels.length > 6000) state.levels.splice(0, 1000);
  }, LEVEL_EVERY_MS);
  return analyser;
}

// WebRTC: the SDK opens the microphone and plays the remote track in its audio element; the
// page only listens to that track.
function webrtcTransport(context, url) {
  const audioElement = document.createElement('audio');
  audioElement.autoplay = true;
  document.body.append(audioElement);
  return new OpenAIRealtimeWebRTC({
    baseUrl: url,
    audioElement,
    changePeerConnection(pc) {
      pc.addEventListener('track', (e) => {
        meter(context, context.createMediaStreamSource(e.streams[0]));
      });
      return pc;
    },
  });
}

// WebSocket: the SDK carries PCM16 at 24 kHz both ways; the app records and plays it.
class SocketAudio {
  constructor(context) {
    this.context = context;
    this.out = meter(context, context.createGain());
    this.out.connect(context.destination);
    this.playing = new Set();
    this.next = 0;
  }

  async listen(session) {
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
    const source = this.context.createMediaStreamSource(stream);
    const recorder = this.context.createScriptProcessor(2048, 1, 1);
    const mute = this.context.createGain();
    mute.gain.value = 0;
    recorder.onaudioprocess = (e) => {
      if (session.transport.status !== 'connected') return;
      const input = e.inputBuffer.getChannelData(0);
      const pcm = new Int16Array(input.length);
      for (let i = 0; i < input.length; i++) {
        pcm[i] = Math.max(-32768, Math.min(32767, Math.round(input[i] * 32768)));
      }
      session.sendAudio(pcm.buffer);
    };
    source.connect(recorder);
    recorder.connect(mute);
    mute.connect(this.context.destination);
  }

  play(data) {
    const pcm = new Int16Array(data);
    const buffer = this.context.createBuffer(1, pcm.length, RATE_HZ);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < pcm.length; i++) channel[i] = pcm[i] / 32768;
    const node = this.context.createBufferSource();
    node.buffer = buffer;
    node.connect(this.out);
    const at = Math.max(this.context.currentTime, this.next);
    node.start(at);
    this.next = at + buffer.duration;
    this.playing.add(node);
    node.onended = () => this.playing.delete(node);
  }

  stop() {
    for (const node of this.playing) node.stop();
    this.playing.clear();
    this.next = 0;
  }
}

async function start({ transport, url }) {
  const context = new AudioContext({ sampleRate: RATE_HZ });
  await context.resume();
  const key = await (await fetch('/key', { method: 'POST' })).json();
  const agent = WITH_TOOLS
    ? new RealtimeAgent({
        name: 'Clock',
        instructions:
          'You are a helpful assistant. When the user asks what time it is, call get_time and ' +
          'tell them the time it gives, in one short sentence.',
        tools: [getTime],
      })
    : new RealtimeAgent({
        name: 'Museum guide',
        instructions: 'You are the museum guide. Answer in one sentence.',
      });
  const layer = transport === 'webrtc' ? webrtcTransport(context, url) : new OpenAIRealtimeWebSocket({ url });
  const session = new RealtimeSession(agent, { transport: layer, model: 'gpt-realtime' });
  session.on('error', note);
  layer.on('error', note);
  session.on('transport_event', (event) => {
    const { delta, audio, ...rest } = event;
    const kept = event.type === 'response.output_audio.delta' ? rest : event;
    state.events.push({ ...kept, at: performance.now() });
  });
  session.on('history_updated', (history) => {
    state.history = history.map((item) => JSON.parse(JSON.stringify(item)));
  });
  let audio = null;
  if (transport === 'websocket') {
    audio = new SocketAudio(context);
    session.on('audio', (event) => {
      state.audioChunks += 1;
      audio.play(event.data);
    });
    session.on('audio_interrupted', () => {
      state.interrupted += 1;
      audio.stop();
    });
  }
  window.session = session;
  state.marks.connecting = performance.now();
  await session.connect({ apiKey: key.value, url });
  state.marks.connected = performance.now();
  if (audio) await audio.listen(session);
  return state.marks.connected - state.marks.connecting;
}

function send(text) {
  state.marks.sent = performance.now();
  window.session.sendMessage(text);
  return state.marks.sent;
}

function interrupt() {
  state.marks.interrupt = performance.now();
  window.session.interrupt();
  return state.marks.interrupt;
}

window.agents = {
  state,
  start: (options) =>
    start(options).catch((error) => {
      note(error);
      throw error;
    }),
  send,
  interrupt,
};
