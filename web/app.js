// The demo page: start/stop a call, show the avatar and the conversation, the latency figures,
// and acknowledge playback. Plain ES modules, no build step, nothing from the network but the
// server itself.

import { AvatarConnection, ConnectError, listDevices, openCamera, openMicrophone } from './rtc.js';
import { LevelMeter, VoiceActivity } from './level.js';
import { EventLog, LatencyPanel } from './panels.js';
import { readStats } from './stats.js';
import { SpeechFollower } from './spoken.js';
import { ToolsPanel } from './tools.js';
import { Conversation } from './transcript.js';

const LEVEL_TICK_MS = 20;
const STATS_TICK_MS = 250; // also the playback acknowledgement interval while a reply plays
const AGENT_SOUND = 0.01; // RMS above this: the avatar's audio is audible
const MIC_SOUND = 0.02;
const ACK_AFTER_DONE_MS = 1000;

const $ = (id) => document.getElementById(id);
const ui = {
  state: $('state'),
  stateText: $('state-text'),
  screen: $('screen'),
  avatar: $('avatar'),
  placeholderText: $('placeholder-text'),
  selfView: $('self-view'),
  turn: $('turn'),
  presence: $('presence'),
  micLevel: $('mic-level'),
  agentLevel: $('agent-level'),
  notice: $('notice'),
  noticeText: $('notice-text'),
  start: $('start'),
  stop: $('stop'),
  interrupt: $('interrupt'),
  mic: $('mic'),
  camera: $('camera'),
  headphones: $('headphones'),
  persona: $('persona'),
  appearance: $('appearance'),
  conditions: $('conditions'),
  composer: $('composer'),
  message: $('message'),
  send: $('send'),
  events: $('events'),
  lat: {
    v2v: $('lat-v2v'),
    v2vDetail: $('lat-v2v-detail'),
    barge: $('lat-barge'),
    bargeDetail: $('lat-barge-detail'),
    rtt: $('lat-rtt'),
    jitter: $('lat-jitter'),
    lost: $('lat-lost'),
    video: $('lat-video'),
    videoDetail: $('lat-video-detail'),
  },
};

const STATE_TEXT = {
  idle: 'Not connected',
  starting: 'Opening the microphone…',
  connecting: 'Connecting…',
  connected: 'Connected',
  reconnecting: 'Connection unstable…',
  error: 'Not connected',
};

const TURN_TEXT = {
  listening: 'Listening',
  user: 'Hearing you',
  thinking: 'Thinking…',
  speaking: 'Speaking',
  paused: 'Paused: hearing you',
};

const conversation = new Conversation($('conversation'));
const latency = new LatencyPanel(ui.lat);
const log = new EventLog(ui.events);
// the Tools panel (web/tools.js): off unless its box is ticked
const tools = new ToolsPanel(
  {
    enabled: $('tools-on'),
    lamp: $('lamp'),
    lampText: $('lamp-text'),
    timer: $('timer'),
    timerLabel: $('timer-label'),
    calls: $('tool-calls'),
    conversation: $('conversation'),
  },
  (event) => send(event),
);

// Everything a running call owns; `null` between calls.
let call = null;
let pageState = 'idle';
let follower = new SpeechFollower();
// Exposed for tests and for curious developers (window.avatarDemo in the console).
const demo = {
  get state() {
    return pageState;
  },
  get pc() {
    return call ? call.connection.pc : null;
  },
  get sessionId() {
    return call ? call.connection.sessionId : null;
  },
  get resumes() {
    return call ? call.connection.resumes : 0; // connections replaced by a resume
  },
  events: [],
  sent: [],
  reveals: [], // {id, at, played, agent}: when each chunk's words were shown
  acks: { count: 0, lastPlayedMs: 0 },
  get figures() {
    return latency.figures;
  },
  stats: null,
  level: { mic: 0, agent: 0 },
  tools,
};
window.avatarDemo = demo;

function setState(next, text) {
  const old = pageState;
  pageState = next;
  ui.state.dataset.state = next;
  ui.stateText.textContent = text || STATE_TEXT[next];
  if (old !== next) console.info(`page: ${old} -> ${next}`);
  const live = next === 'starting' || next === 'connecting' || next === 'connected' || next === 'reconnecting';
  ui.start.disabled = live;
  ui.stop.disabled = !live;
  const talking = next === 'connected' || next === 'reconnecting';
  ui.message.disabled = !talking;
  ui.send.disabled = !talking;
  if (!talking) {
    ui.interrupt.disabled = true;
    setTurn(null);
  }
}

function setTurn(turn) {
  ui.turn.hidden = !turn;
  if (turn) {
    ui.turn.dataset.turn = turn;
    ui.turn.textContent = TURN_TEXT[turn];
  }
}

function showNotice(text, kind = 'error') {
  ui.notice.dataset.kind = kind;
  ui.noticeText.textContent = text;
  ui.notice.hidden = false;
}

function hideNotice() {
  ui.notice.hidden = true;
}

function explain(err) {
  if (!(err instanceof ConnectError)) return `Something went wrong: ${err && err.message ? err.message : err}`;
  switch (err.kind) {
    case 'permission':
      return `${err.message} Allow microphone access for this site (the icon in the address bar), then press Start again.`;
    case 'no-device':
      return `${err.message} Connect a microphone, choose it in the list and press Start again.`;
    case 'device-busy':
      return `${err.message} Another application may be using it; close it or choose another device.`;
    case 'full': {
      const retry = err.detail.retryAfterS ? ` Try again in ${err.detail.retryAfterS} s.` : ' Try again shortly.';
      return `The server is full: every conversation slot is taken (${err.message}).${retry}`;
    }
    case 'unreachable':
      return `${err.message} Check that the server is running and the network is up, then press Start again.`;
    case 'timeout':
      return `${err.message} The network may block WebRTC (UDP); try again or ask for a TURN server.`;
    default:
      return err.message;
  }
}

// --- devices ----------------------------------------------------------------------------------
/** `select`'s options: `firstLabel` (value ''), then each `{label, deviceId}`; keeps the choice. */
function fillSelect(select, devices, firstLabel) {
  const chosen = select.value;
  select.replaceChildren(new Option(firstLabel, ''));
  for (const d of devices) select.append(new Option(d.label, d.deviceId));
  if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
}

/** Show the device a track actually uses (the browser may have picked the default). */
function selectDevice(select, track) {
  const id = track && track.getSettings().deviceId;
  if (id && [...select.options].some((o) => o.value === id)) select.value = id;
}

async function refreshDevices() {
  try {
    const { mics, cameras } = await listDevices();
    fillSelect(ui.mic, mics, 'Default microphone');
    fillSelect(ui.camera, cameras, 'No camera');
  } catch (err) {
    console.warn('cannot list devices', err);
  }
}

// --- the call -----------------------------------------------------------------------------------
/** An AudioContext for the level meters (created on the Start click), or null without WebAudio. */
function openAudioContext() {
  try {
    const context = new AudioContext();
    context.resume().catch(() => {});
    return context;
  } catch (err) {
    console.warn('no WebAudio: levels come from getStats', err);
    return null;
  }
}

/** A level meter on `track`, or null (the reply's level then comes from getStats). */
function meter(context, track) {
  if (!context) return null;
  try {
    return new LevelMeter(context, track);
  } catch (err) {
    console.warn('no level meter', err);
    return null;
  }
}

async function start() {
  if (call) return;
  hideNotice();
  setState('starting');
  const audioContext = openAudioContext();
  call = {
    connection: new AvatarConnection('.'),
    audioContext,
    mic: null,
    camera: null,
    micMeter: null,
    agentMeter: null,
    micVoice: new VoiceActivity(MIC_SOUND, 250),
    agentVoice: new VoiceActivity(AGENT_SOUND, 150),
    timers: [],
    session: null, // the server's own description (`x-avatar.session`)
    realtime: null, // the OpenAI Realtime session (`session.created`, `session.updated`)
    // the reply in progress: {id, itemId, firstSoundMs, voiceEndMs, pageV2V, chunks, lastChunk,
    // cut}; `chunks`: the server's chunk id (of viseme events) -> the page's chunk id
    response: null,
    lastServerChunk: -Infinity, // the highest server chunk id placed
    lastDoneMs: -Infinity,
    userVoiceEndMs: null,
    barge: null, // {t0, source}
    pausedAtMs: null, // where the reply paused (output timeline ms) while the server decides
    turnBeforePause: null, // the turn badge to show again if the reply resumes
    lastAckMs: -1,
    lastResponse: null, // the reply that ended last (its timings follow its response.done)
    played: null, // {ms: output timeline played, at: performance.now() of the reading}
    playedBaseMs: 0, // played on the connections a resume replaced (a new one counts from 0)
    remoteTracks: { audio: null, video: null }, // the tracks the avatar element was given
  };
  const current = call;
  try {
    current.mic = await openMicrophone(ui.mic.value, !ui.headphones.checked);
    if (ui.camera.value) {
      try {
        current.camera = await openCamera(ui.camera.value);
      } catch (err) {
        showNotice(`${explain(err)} Continuing without the camera.`, 'warn');
      }
    }
    if (call !== current) {
      stopTracks(current); // Stop was pressed while the browser asked for permission
      return;
    }
    await refreshDevices();
    selectDevice(ui.mic, current.mic);
    selectDevice(ui.camera, current.camera);
    current.micMeter = meter(audioContext, current.mic);
    showSelfView(current.camera);
    setState('connecting');
    const { connection } = current;
    connection.addEventListener('message', (e) => onServerEvent(e.detail));
    connection.addEventListener('track', (e) => onRemoteStream(e.detail));
    connection.addEventListener('state', (e) => onConnectionState(e.detail));
    connection.addEventListener('lost', (e) => fail(e.detail));
    await connection.start(current.mic, current.camera);
    if (call !== current) return;
    current.timers.push(setInterval(levelTick, LEVEL_TICK_MS), setInterval(statsTick, STATS_TICK_MS));
    if (!current.session) setState('connecting', 'Waiting for the server…');
  } catch (err) {
    if (call === current) fail(err);
  }
}

function fail(err) {
  console.warn('call failed', err);
  teardown();
  setState('error', err instanceof ConnectError && err.kind === 'full' ? 'Server full' : 'Not connected');
  showNotice(explain(err));
}

function stop() {
  if (!call) return;
  teardown();
  setState('idle', 'Stopped');
}

function teardown() {
  const current = call;
  call = null;
  if (!current) return;
  current.timers.forEach(clearInterval);
  current.connection.stop();
  stopTracks(current);
  if (current.micMeter) current.micMeter.close();
  if (current.agentMeter) current.agentMeter.close();
  if (current.audioContext) current.audioContext.close().catch(() => {});
  ui.avatar.srcObject = null;
  ui.screen.dataset.video = 'none';
  ui.screen.style.removeProperty('--vw');
  ui.screen.style.removeProperty('--vh');
  ui.placeholderText.innerHTML = 'Press <strong>Start</strong> to talk again.';
  showSelfView(null);
  ui.presence.hidden = true;
  ui.micLevel.style.width = '0';
  ui.agentLevel.style.width = '0';
  tools.reset();
  if (current.response) conversation.responseDone(current.response.id, 'cancelled', []);
  conversation.dropped(follower.drop());
  follower = follower.next();
}

function stopTracks(current) {
  for (const track of [current.mic, current.camera]) if (track) track.stop();
}

function showSelfView(track) {
  ui.selfView.hidden = !track;
  ui.selfView.srcObject = track ? new MediaStream([track]) : null;
}

function onRemoteStream(stream) {
  if (!call) return;
  const audio = stream.getAudioTracks()[0] || null;
  const video = stream.getVideoTracks()[0] || null;
  const shown = call.remoteTracks;
  // A resumed connection brings new tracks: the element is given the stream again (it may
  // have ended with the old ones) and the level meter listens to the new audio.
  const renewed = (shown.audio && audio && audio !== shown.audio) || (shown.video && video && video !== shown.video);
  if (renewed || ui.avatar.srcObject !== stream) {
    ui.avatar.srcObject = null;
    ui.avatar.srcObject = stream;
  }
  ui.avatar.play().catch(() => {});
  if (audio && audio !== shown.audio) {
    if (call.agentMeter) call.agentMeter.close();
    call.agentMeter = meter(call.audioContext, audio);
  }
  call.remoteTracks = { audio: audio || shown.audio, video: video || shown.video };
  if (video && ui.screen.dataset.video !== 'playing') ui.screen.dataset.video = 'waiting';
}

function onConnectionState(state) {
  if (!call) return;
  if (state === 'reconnecting') {
    // the connection was lost: a new one resumes the conversation (the page keeps its record)
    call.playedBaseMs = call.played ? call.played.ms : call.playedBaseMs;
    call.played = null;
    setState('reconnecting', 'Reconnecting…');
  } else if (state === 'disconnected') {
    setState('reconnecting');
  } else if (state === 'connected' && call.session) {
    setState('connected');
  }
}

ui.avatar.addEventListener('resize', () => {
  const { videoWidth: w, videoHeight: h } = ui.avatar;
  if (w > 0 && h > 0) {
    ui.screen.dataset.video = 'playing';
    ui.screen.style.setProperty('--vw', String(w));
    ui.screen.style.setProperty('--vh', String(h));
  }
});

// --- server events ---------------------------------------------------------------------------
function send(event) {
  if (!call || !call.connection.send(event)) return false;
  if (event.type !== 'x-avatar.playback.ack') log.add(event, 'out');
  demo.sent.push(event);
  if (demo.sent.length > 2000) demo.sent.splice(0, 1000);
  return true;
}

// Each chunk (sentence) of a reply gets an id of the page's own, unique across replies.
let nextChunkId = 1;

function onServerEvent(event) {
  if (!call) return;
  demo.events.push(event);
  if (demo.events.length > 2000) demo.events.splice(0, 1000);
  log.add(event);
  const now = performance.now();
  const response = call.response;
  const current = (id) => response != null && id === response.id;
  switch (event.type) {
    case 'session.created': // the OpenAI Realtime session; the server's own follows it
    case 'session.updated':
      call.realtime = event.session || null;
      break;
    case 'x-avatar.session':
      if (event.resumed && call.session) {
        // the same conversation on a new connection: the transcript, the turn, the reply in
        // progress and the chosen conditions all go on (the server kept them too)
        call.session = { ...call.session, id: event.session.id };
        setState('connected');
        break;
      }
      call.session = event.session;
      setState('connected');
      setTurn('listening');
      offerAppearances(event.session.appearances);
      showConditions(event.session, null);
      if (!event.session.video) ui.placeholderText.textContent = 'This server sends no video: listen to the avatar.';
      applySelections();
      break;
    case 'input_audio_buffer.speech_started': {
      conversation.speechStarted();
      setTurn('user');
      if (call.agentVoice.active) {
        // a barge-in: time from the user's first sound to the reply going silent
        const voice = call.micVoice;
        const t0 = voice.active && now - voice.startedMs < 1500 ? voice.startedMs : now;
        call.barge = { t0, source: voice.active ? 'voice' : 'speech_started' };
      }
      break;
    }
    case 'input_audio_buffer.speech_stopped': {
      setTurn('thinking');
      const end = call.micVoice.endedMs;
      call.userVoiceEndMs = end != null && now - end < 3000 ? end : null;
      break;
    }
    case 'x-avatar.transcription.partial':
      // the whole hypothesis so far (GA's own deltas carry only the newly stable words)
      conversation.partial(event.transcript || '', event.stable || '');
      break;
    case 'conversation.item.input_audio_transcription.completed':
      conversation.final(event.transcript || '');
      if (!event.transcript) setTurn('listening');
      break;
    case 'response.created': {
      const id = event.response && event.response.id;
      if (!id) break;
      call.response = {
        id,
        itemId: null,
        firstSoundMs: null,
        voiceEndMs: call.userVoiceEndMs, // the end of the user's voice, if this page heard it
        pageV2V: false,
        chunks: new Map(),
        lastChunk: null,
        cut: false,
      };
      call.userVoiceEndMs = null;
      follower = follower.next();
      conversation.responseCreated(id);
      ui.interrupt.disabled = false;
      setTurn('thinking');
      break;
    }
    case 'response.output_item.added':
      // the reply's spoken item (a function call item is no speech)
      if (current(event.response_id) && event.item && event.item.type !== 'function_call') response.itemId = event.item.id;
      break;
    case 'response.output_audio_transcript.delta': {
      // one delta is one chunk's text, sent before its audio; other replies' are stale
      if (!current(event.response_id)) break;
      const text = (event.delta || '').trim();
      if (!text) break;
      const id = nextChunkId;
      nextChunkId += 1;
      response.itemId = response.itemId || event.item_id;
      response.lastChunk = id;
      conversation.chunk(response.id, id, text);
      follower.add(id, text);
      break;
    }
    case 'conversation.item.truncated':
      // a barge-in: nothing more of this reply plays; what was heard comes with response.done
      call.pausedAtMs = null; // a pause that ended in an interruption
      if (response && (!response.itemId || event.item_id === response.itemId)) {
        response.cut = true;
        follower.drop();
      }
      break;
    case 'response.done':
      onResponseDone(event.response || {}, now);
      break;
    case 'x-avatar.response.timings': {
      // the figures of the reply that just ended; the page's own measure where it has one
      latency.serverTimings(event);
      const last = call.lastResponse;
      const measured = last && last.id === event.response_id && last.pageV2V;
      if (!measured && typeof event.voice_to_voice_ms === 'number') {
        latency.voiceToVoice(event.voice_to_voice_ms, 'server');
      }
      break;
    }
    case 'x-avatar.output_audio_buffer.paused':
      // the server heard voice over its reply: it holds the audio while it decides whether
      // that was an interruption (then response.done says cancelled) or not (resumed)
      if (!current(event.response_id) && event.response_id) break;
      call.pausedAtMs = event.position_ms;
      call.turnBeforePause = ui.turn.dataset.turn;
      setTurn('paused');
      break;
    case 'x-avatar.output_audio_buffer.resumed':
      // no interruption after all (a cough, "mm-hm"): the reply plays on from where it paused,
      // so what it placed after the pause comes later by the pause's length
      if (!current(event.response_id) && event.response_id) break;
      if (call.pausedAtMs != null) follower.shift(call.pausedAtMs, event.paused_ms);
      call.pausedAtMs = null;
      conversation.notice(`Resumed after ${Math.round(event.paused_ms)} ms (${event.reason})`, 'info');
      if (ui.turn.dataset.turn === 'paused') setTurn(call.turnBeforePause || 'speaking');
      break;
    case 'x-avatar.barge_in':
      if (typeof event.reaction_ms === 'number') {
        latency.bargeIn(event.reaction_ms, 'server');
      }
      break;
    case 'x-avatar.session.applied':
      showConditions(event, event.version);
      break;
    case 'x-avatar.vision.presence':
      showPresence(event);
      break;
    case 'error': {
      const err = event.error || {};
      // an interrupt that came just too late
      if (err.code === 'no_active_response' || err.code === 'response_cancel_not_active') break;
      if (err.code === 'timeout') {
        // the server gave up on this turn (its message is written for people): listen again
        conversation.notice(err.message || 'That took too long and was stopped.', 'error');
        if (err.stage === 'asr') conversation.final(''); // the words were never transcribed
        if (ui.turn.dataset.turn !== 'user') setTurn('listening');
        break;
      }
      conversation.notice(`Server: ${err.message || err.code || 'error'}`, 'error');
      if (call.conditions) showConditions(call.conditions, call.conditions.version ?? null);
      break;
    }
    case 'x-avatar.viseme': {
      // the chunk's place on the output timeline: its words show when the audio gets there
      // (the first sounding one: a chunk may begin with a moment of silence). A chunk's
      // visemes come after its text and before the next chunk's text; the server numbers
      // chunks in order, so an unknown lower number is a stale reply's.
      if (!response || (event.response_id != null && !current(event.response_id))) break;
      const placed = [...response.chunks.values()];
      const fresh = !(event.chunk_id <= call.lastServerChunk);
      if (!response.chunks.has(event.chunk_id) && fresh && response.lastChunk != null && !placed.includes(response.lastChunk)) {
        response.chunks.set(event.chunk_id, response.lastChunk);
        call.lastServerChunk = event.chunk_id;
      }
      const id = response.chunks.get(event.chunk_id);
      if (id != null && event.viseme !== 0) follower.place(id, event.pts_ms);
      break;
    }
    default:
      break; // logged only
  }
  tools.onEvent(event);
}

/** What of the reply was heard: the transcript of its assistant item (null: not said). */
function heardTranscript(done) {
  const output = Array.isArray(done.output) ? done.output : [];
  const item = output.find((o) => o && o.type === 'message' && o.role === 'assistant');
  const content = item && Array.isArray(item.content) ? item.content : [];
  const part = content.find((c) => c && typeof c.transcript === 'string');
  if (part) return part.transcript;
  return item ? '' : null;
}

function onResponseDone(done, now) {
  const response = call.response;
  call.pausedAtMs = null;
  const status = done.status || 'failed';
  if (response && response.id === done.id) {
    call.response = null;
    call.lastResponse = response;
    call.lastDoneMs = now;
    if (status === 'completed') {
      conversation.responseDone(done.id, 'completed', follower.finish());
    } else {
      // the server's transcript of the item says which chunks were heard, and how much of
      // the one cut short; without it, what the page never showed counts as dropped
      const unshown = follower.drop();
      const heard = heardTranscript(done);
      if (heard != null) conversation.cut(done.id, heard, response.cut);
      else conversation.dropped(unshown);
      conversation.dropQueued(done.id);
      conversation.responseDone(done.id, status, []);
    }
  } else {
    conversation.responseDone(done.id, status, []);
  }
  ui.interrupt.disabled = true;
  if (ui.turn.dataset.turn !== 'user') setTurn('listening');
}

// --- conditions (persona, appearance) ---------------------------------------------------------
function showConditions(values, version) {
  if (call) call.conditions = { ...values, version };
  const preset = [...ui.persona.options].find((o) => o.value && o.value === values.persona);
  const isDefault = call && call.session && values.persona === call.session.persona;
  const personaName = preset ? preset.textContent : isDefault ? 'default' : 'custom';
  const v = version == null ? '' : ` (applied, v${version})`;
  ui.conditions.textContent = `Now: ${personaName} persona · ${values.appearance} appearance · ${values.voice} voice${v}`;
  ui.conditions.dataset.appearance = values.appearance;
  ui.conditions.dataset.version = version == null ? '0' : String(version);
}

function offerAppearances(names) {
  if (!Array.isArray(names) || !names.length) return; // the server does not say: keep the list
  const looks = names.map((name) => ({ deviceId: name, label: name.charAt(0).toUpperCase() + name.slice(1) }));
  fillSelect(ui.appearance, looks, 'Server default');
}

function wanted(select, field) {
  if (select.value) return select.value;
  return call && call.session ? call.session[field] : null; // back to the server's default
}

function applySelections(only = null) {
  if (!call || !call.session) return;
  const changes = {};
  for (const [select, field] of [[ui.persona, 'persona'], [ui.appearance, 'appearance']]) {
    if (only && only !== field) continue;
    const value = wanted(select, field);
    if (value && (select.value || only)) changes[field] = value;
  }
  if (!Object.keys(changes).length) return;
  // the persona is the Realtime session's instructions; the appearance is this server's own
  if (changes.persona) {
    send({ type: 'session.update', session: { type: 'realtime', instructions: changes.persona } });
  }
  if (changes.appearance) {
    send({ type: 'x-avatar.session.update', session: { appearance: changes.appearance } });
  }
  ui.conditions.textContent = 'Applying at the next sentence…';
}

// --- periodic work ---------------------------------------------------------------------------
function levelTick() {
  if (!call) return;
  const now = performance.now();
  const mic = call.micMeter ? call.micMeter.level() : 0;
  const agent = call.agentMeter ? call.agentMeter.level() : (demo.stats && demo.stats.audio.level) || 0;
  demo.level.mic = mic;
  demo.level.agent = agent;
  ui.micLevel.style.width = `${Math.min(100, mic * 400)}%`;
  ui.agentLevel.style.width = `${Math.min(100, agent * 400)}%`;
  call.micVoice.update(mic, now);
  const change = call.agentVoice.update(agent, now);
  if (change === 'start' && call.response && call.response.firstSoundMs == null) {
    call.response.firstSoundMs = now;
    if (call.response.voiceEndMs != null) {
      call.response.pageV2V = true;
      latency.voiceToVoice(now - call.response.voiceEndMs, 'page');
    }
  }
  if (change === 'start' && call.response) setTurn('speaking');
  if (change === 'end' && call.barge) {
    latency.bargeIn(call.agentVoice.endedMs - call.barge.t0, call.barge.source);
    call.barge = null;
  }
  if (call.barge && now - call.barge.t0 > 3000) call.barge = null;
  if (call.response && call.pausedAtMs == null) {
    // while the reply is paused nothing of it plays: the follower holds (the played time
    // still counts the silence; the resume moves what was placed after the pause)
    const played = call.played ? call.played.ms + (now - call.played.at) : null;
    for (const id of follower.update(now, agent >= AGENT_SOUND, played)) {
      conversation.spoken(id);
      demo.reveals.push({ id, at: Math.round(now), played: played && Math.round(played), agent });
      if (demo.reveals.length > 500) demo.reveals.splice(0, 250);
    }
  }
}

async function statsTick() {
  const current = call;
  if (!current || current.connection.reconnecting) return;
  const { pc } = current.connection;
  let stats;
  const at = performance.now();
  try {
    stats = await readStats(pc);
  } catch {
    return;
  }
  if (call !== current || current.connection.pc !== pc || current.connection.reconnecting) return;
  demo.stats = stats;
  // the output timeline goes on across a resume; a new connection counts its audio from 0
  const playedMs = stats.audio.playedMs == null ? null : current.playedBaseMs + stats.audio.playedMs;
  if (playedMs != null) current.played = { ms: playedMs, at };
  latency.stats(stats);
  // playback acknowledgement: how much of the output timeline has played here
  const playing = current.response || performance.now() - current.lastDoneMs < ACK_AFTER_DONE_MS;
  const played = follower.timeline(playedMs);
  if (playing && played != null && Math.round(played) > current.lastAckMs) {
    current.lastAckMs = Math.round(played);
    if (send({ type: 'x-avatar.playback.ack', played_ms: current.lastAckMs })) {
      demo.acks.count += 1;
      demo.acks.lastPlayedMs = current.lastAckMs;
    }
  }
}

// --- presence -----------------------------------------------------------------------------------
function showPresence(event) {
  const state = event.state || (event.present ? 'present' : 'away');
  ui.presence.hidden = state === 'unknown';
  ui.presence.dataset.present = String(state === 'present');
  ui.presence.textContent = state === 'present' ? 'You are in view' : 'No one in view';
}

// --- controls ---------------------------------------------------------------------------------
function interrupt() {
  if (!call || !call.response) return;
  if (call.agentVoice.active) call.barge = { t0: performance.now(), source: 'button' };
  send({ type: 'response.cancel' });
}

ui.start.addEventListener('click', start);
ui.stop.addEventListener('click', stop);
ui.interrupt.addEventListener('click', interrupt);
ui.notice.querySelector('#notice-close').addEventListener('click', hideNotice);
document.addEventListener('keydown', (e) => {
  if (e.key === 'Escape' && call && call.response) interrupt();
});

ui.composer.addEventListener('submit', (e) => {
  e.preventDefault();
  const text = ui.message.value.trim();
  if (!text || !call) return;
  // a typed message only adds an item: the reply in progress is cancelled first, and the
  // answer is asked for after it
  const item = { type: 'message', role: 'user', content: [{ type: 'input_text', text }] };
  if (call.response) send({ type: 'response.cancel' });
  if (send({ type: 'conversation.item.create', item })) {
    send({ type: 'response.create' });
    conversation.typed(text);
    ui.message.value = '';
    setTurn('thinking');
  }
});

ui.persona.addEventListener('change', () => applySelections('persona'));
ui.appearance.addEventListener('change', () => applySelections('appearance'));

async function switchMicrophone() {
  if (!call || !call.connection.pc) return;
  try {
    const track = await openMicrophone(ui.mic.value, !ui.headphones.checked);
    await call.connection.replaceMicrophone(track);
    call.mic.stop();
    if (call.micMeter) call.micMeter.close();
    call.mic = track;
    call.micMeter = meter(call.audioContext, track);
  } catch (err) {
    showNotice(explain(err), 'warn');
  }
}

ui.mic.addEventListener('change', switchMicrophone);
ui.headphones.checked = localStorage.getItem('avatar.headphones') === '1';
ui.headphones.addEventListener('change', () => {
  localStorage.setItem('avatar.headphones', ui.headphones.checked ? '1' : '0');
  switchMicrophone();
});

ui.camera.addEventListener('change', async () => {
  if (!call || !call.connection.pc) return;
  try {
    const track = ui.camera.value ? await openCamera(ui.camera.value) : null;
    await call.connection.replaceCamera(track);
    if (call.camera) call.camera.stop();
    call.camera = track;
    showSelfView(track);
  } catch (err) {
    showNotice(explain(err), 'warn');
  }
});

window.addEventListener('pagehide', () => {
  if (call) teardown();
});
if (navigator.mediaDevices && navigator.mediaDevices.addEventListener) {
  navigator.mediaDevices.addEventListener('devicechange', refreshDevices);
}
refreshDevices();
setState('idle');
