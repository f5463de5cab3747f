// One WebRTC session with the avatar server: local media, offer/answer over POST /offer, the
// `oai-events` data channel (OpenAI Realtime GA events, plus the server's `x-avatar.*` ones).
// Every failure becomes a ConnectError with a `kind` the page explains.

const GATHER_TIMEOUT_MS = 3000;
const OFFER_TIMEOUT_MS = 15000;
const ICE_SERVERS_TIMEOUT_MS = 3000;
const CONNECT_TIMEOUT_MS = 15000;
const WATCH_INTERVAL_MS = 500; // how often a call checks that its connection is still there
const STALL_MS = 4000; // no audio from the server this long: the connection is gone
const RESUME_ATTEMPTS = 3;
const RESUME_BACKOFF_MS = 1500; // before the 2nd attempt; twice that before the 3rd
// The label chooses the server's event dialect: `oai-events` speaks OpenAI Realtime GA (the
// older `events` label gets the server's native dialect).
export const EVENTS_LABEL = 'oai-events';

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** A failure to start or keep a session; `kind` says which, `detail` carries figures. */
export class ConnectError extends Error {
  constructor(kind, message, detail = {}) {
    super(message);
    this.name = 'ConnectError';
    this.kind = kind; // insecure | permission | no-device | device-busy | full | unreachable |
    //                   rejected | timeout | lost
    this.detail = detail;
  }
}

function mediaError(err, what) {
  switch (err && err.name) {
    case 'NotAllowedError':
    case 'SecurityError':
      return new ConnectError('permission', `${what} permission was denied.`);
    case 'NotFoundError':
    case 'OverconstrainedError':
      return new ConnectError('no-device', `No ${what.toLowerCase()} was found.`);
    case 'NotReadableError':
    case 'AbortError':
      return new ConnectError('device-busy', `The ${what.toLowerCase()} could not be opened.`);
    default:
      return new ConnectError('device-busy', `${what}: ${err && err.message ? err.message : err}`);
  }
}

function requireMediaDevices() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new ConnectError(
      'insecure',
      'This browser only allows the microphone on https:// or http://localhost pages.',
    );
  }
}

/**
 * The microphone (`deviceId` "" = default). Echo cancellation is for loudspeakers; with
 * headphones it only gets in the way (it damps the user's voice while the avatar talks).
 */
export async function openMicrophone(deviceId, echoCancellation = true) {
  requireMediaDevices();
  const audio = { echoCancellation, noiseSuppression: true, autoGainControl: true };
  if (deviceId) audio.deviceId = { exact: deviceId };
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio });
    return stream.getAudioTracks()[0];
  } catch (err) {
    throw mediaError(err, 'Microphone');
  }
}

/** Stands for "a camera" before the browser tells which cameras there are. */
export const ANY_CAMERA = '*';

/** A camera track (640x480 ideal), or a ConnectError. */
export async function openCamera(deviceId) {
  requireMediaDevices();
  const video = { width: { ideal: 640 }, height: { ideal: 480 } };
  if (deviceId && deviceId !== ANY_CAMERA) video.deviceId = { exact: deviceId };
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ video });
    return stream.getVideoTracks()[0];
  } catch (err) {
    throw mediaError(err, 'Camera');
  }
}

/**
 * Audio inputs and cameras, as {deviceId, label} lists. Before the user allows access the
 * browser hides which devices there are: then a camera, if any, is offered as ANY_CAMERA.
 */
export async function listDevices() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) {
    return { mics: [], cameras: [] };
  }
  const devices = await navigator.mediaDevices.enumerateDevices();
  const pick = (kind, name) =>
    devices
      .filter((d) => d.kind === kind && d.deviceId && d.deviceId !== 'default')
      .map((d, i) => ({ deviceId: d.deviceId, label: d.label || `${name} ${i + 1}` }));
  let cameras = pick('videoinput', 'Camera');
  if (!cameras.length && devices.some((d) => d.kind === 'videoinput')) {
    cameras = [{ deviceId: ANY_CAMERA, label: 'Camera' }];
  }
  return { mics: pick('audioinput', 'Microphone'), cameras };
}

function waitForGathering(pc, timeoutMs) {
  if (pc.iceGatheringState === 'complete') return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      pc.removeEventListener('icegatheringstatechange', check);
      clearTimeout(timer);
      resolve();
    };
    const check = () => {
      if (pc.iceGatheringState === 'complete') done();
    };
    const timer = setTimeout(done, timeoutMs); // use the candidates we have
    pc.addEventListener('icegatheringstatechange', check);
  });
}

/**
 * The server's STUN/TURN servers for our RTCPeerConnection (TURN credentials may be issued
 * per call and expire). None on any failure: the offer that follows reports what is wrong.
 */
async function fetchIceServers(baseUrl) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), ICE_SERVERS_TIMEOUT_MS);
  try {
    const response = await fetch(`${baseUrl}/ice-servers`, { signal: abort.signal, cache: 'no-store' });
    if (!response.ok) return [];
    const body = await response.json();
    return Array.isArray(body.iceServers) ? body.iceServers : [];
  } catch (err) {
    console.warn('no ICE servers from the server:', err);
    return [];
  } finally {
    clearTimeout(timer);
  }
}

/**
 * POST the offer (with `resumeToken`: resume that conversation on this new connection, and
 * `lastEventId`: the last event received, so that the server sends again what the lost
 * connection took after it). The server's answer, or a ConnectError; a refusal's `detail` has
 * the HTTP `status` and the body's `code`.
 */
async function postOffer(baseUrl, offer, resumeToken = null, lastEventId = null) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), OFFER_TIMEOUT_MS);
  const request = { sdp: offer.sdp, type: offer.type };
  if (resumeToken) request.resume_token = resumeToken;
  if (resumeToken && lastEventId) request.last_event_id = lastEventId;
  let response;
  try {
    response = await fetch(`${baseUrl}/offer`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(request),
      signal: abort.signal,
    });
  } catch (err) {
    const where = new URL(baseUrl, window.location.href).href;
    if (err.name === 'AbortError') {
      throw new ConnectError('timeout', `The server at ${where} did not answer within ${OFFER_TIMEOUT_MS / 1000} s.`);
    }
    throw new ConnectError('unreachable', `Cannot reach the server at ${where}.`);
  } finally {
    clearTimeout(timer);
  }
  let body = {};
  try {
    body = await response.json();
  } catch {
    body = {};
  }
  if (response.status === 503) {
    const retry = Number(response.headers.get('Retry-After')) || null;
    throw new ConnectError('full', body.error || 'The server is full.', { retryAfterS: retry });
  }
  if (!response.ok) {
    throw new ConnectError(
      'rejected',
      `The server refused the call (${response.status}): ${body.error || response.statusText}`,
      { status: response.status, code: body.code || null },
    );
  }
  return body;
}

/**
 * A call: `start()` connects; events: 'message' (detail: a server event object), 'state'
 * (detail: the RTCPeerConnection state, or 'reconnecting' while a lost connection is being
 * replaced), 'lost' (detail: ConnectError), 'track' (detail: stream).
 *
 * A lost connection (the peer connection failed or closed, the events channel closed, or no
 * audio came for STALL_MS) is replaced by a new one that resumes the same conversation with
 * the newest resume token the server gave (`x-avatar.session`): up to RESUME_ATTEMPTS tries,
 * then 'lost'. `stop()` ends the conversation on the server; nothing resumes after it.
 */
export class AvatarConnection extends EventTarget {
  /** `baseUrl`: where the server's routes are, relative to the page ('.': beside it). */
  constructor(baseUrl = '.') {
    super();
    this.baseUrl = baseUrl;
    this.pc = null;
    this.channel = null;
    this.sessionId = null;
    this.remoteStream = new MediaStream();
    this.resumeToken = null; // the newest one the server gave; each works once
    this.lastEventId = null; // of the last event received: a resume gets the rest again
    this.resumeWindowS = null;
    this.reconnecting = false;
    this.resumes = 0; // connections replaced so far
    this._iceServers = [];
    this._mic = null;
    this._camera = null;
    this._audioSender = null;
    this._videoSender = null;
    this._watchdog = null;
    this._stopped = false;
  }

  /** Connect with the microphone track `mic` and an optional camera track. */
  async start(mic, camera = null) {
    this._mic = mic;
    this._camera = camera;
    this._iceServers = await fetchIceServers(this.baseUrl);
    if (this._stopped) return;
    await this._connect(null);
    if (this._stopped) return;
    this._onState();
  }

  /**
   * A new peer connection with the call's tracks, its offer posted (`resumeToken`: resuming),
   * up until its events channel opens. It is `this.pc` from the start (stop() closes it).
   * Throws a ConnectError; returns false if the call was stopped meanwhile.
   */
  async _connect(resumeToken) {
    const pc = new RTCPeerConnection({ iceServers: this._iceServers });
    this.pc = pc;
    const channel = pc.createDataChannel(EVENTS_LABEL, { ordered: true });
    this.channel = channel;
    const local = new MediaStream([this._mic]);
    this._audioSender = pc.addTransceiver(this._mic, { direction: 'sendrecv', streams: [local] }).sender;
    // Always send-capable, so a camera can be switched on later without renegotiation.
    const video = pc.addTransceiver(this._camera || 'video', { direction: 'sendrecv' });
    this._videoSender = video.sender;
    pc.addEventListener('track', (event) => this._onTrack(pc, event.track));
    channel.addEventListener('message', (event) => this._onMessage(event.data));
    const opened = new Promise((resolve) => channel.addEventListener('open', resolve, { once: true }));

    await pc.setLocalDescription(await pc.createOffer());
    await waitForGathering(pc, GATHER_TIMEOUT_MS);
    if (this._stopped) return false;
    const answer = await postOffer(this.baseUrl, pc.localDescription, resumeToken, this.lastEventId);
    if (this._stopped) {
      if (!resumeToken) this._deleteSession(answer.session_id); // stop() already deleted a resumed one
      return false;
    }
    this.sessionId = answer.session_id;
    await pc.setRemoteDescription({ type: answer.type, sdp: answer.sdp });

    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(
        () => reject(new ConnectError('timeout', 'The media connection did not come up in time.')),
        CONNECT_TIMEOUT_MS,
      );
    });
    const failed = new Promise((_, reject) => {
      pc.addEventListener('connectionstatechange', () => {
        if (pc.connectionState === 'failed' || pc.connectionState === 'closed') {
          reject(new ConnectError('lost', 'The media connection to the server failed.'));
        }
      });
    });
    try {
      await Promise.race([opened, timeout, failed]);
    } finally {
      clearTimeout(timer);
    }
    if (this._stopped || pc !== this.pc) return false;
    pc.addEventListener('connectionstatechange', () => {
      if (pc === this.pc && !this.reconnecting) this._onState();
    });
    channel.addEventListener('close', () => this._connectionLost(pc, 'The server closed the conversation.'));
    this._watch(pc, channel);
    return true;
  }

  /** The remote stream the page shows gets `track` in place of the lost connection's one. */
  _onTrack(pc, track) {
    if (pc !== this.pc || this._stopped) return;
    for (const old of this.remoteStream.getTracks()) {
      if (old.kind === track.kind && old !== track) this.remoteStream.removeTrack(old);
    }
    if (!this.remoteStream.getTracks().includes(track)) this.remoteStream.addTrack(track);
    this.dispatchEvent(new CustomEvent('track', { detail: this.remoteStream }));
  }

  /**
   * Notice a lost connection by itself: a local `pc.close()` fires no event in Chrome, and a
   * connection whose packets vanish takes Chrome ~30 s to call failed; the server sends audio
   * all the time (silence too), so its absence is the quicker sign.
   */
  _watch(pc, channel) {
    this._unwatch();
    let bytes = 0;
    let changedAt = performance.now();
    let reading = false;
    this._watchdog = setInterval(async () => {
      if (pc !== this.pc || this._stopped || this.reconnecting) return;
      const state = pc.connectionState;
      if (state === 'closed' || state === 'failed' || channel.readyState === 'closed') {
        this._connectionLost(pc, 'The connection to the server was lost.');
        return;
      }
      if (reading) return;
      reading = true;
      try {
        let received = 0;
        (await pc.getStats()).forEach((s) => {
          if (s.type === 'inbound-rtp' && s.kind === 'audio') received += s.bytesReceived ?? 0;
        });
        const now = performance.now();
        if (received !== bytes) {
          bytes = received;
          changedAt = now;
        } else if (bytes > 0 && now - changedAt > STALL_MS) {
          this._connectionLost(pc, 'The connection to the server was lost.');
        }
      } catch {
        // a closed connection: the next tick sees it
      } finally {
        reading = false;
      }
    }, WATCH_INTERVAL_MS);
  }

  _unwatch() {
    clearInterval(this._watchdog);
    this._watchdog = null;
  }

  _onState() {
    const state = this.pc ? this.pc.connectionState : 'closed';
    this.dispatchEvent(new CustomEvent('state', { detail: state }));
    if (state === 'failed') this._connectionLost(this.pc, 'The connection to the server was lost.');
  }

  /** `pc` (if still the call's connection) is gone: resume the conversation, or give up. */
  _connectionLost(pc, message) {
    if (this._stopped || this.reconnecting || pc !== this.pc) return;
    this._unwatch();
    if (!this.resumeToken) {
      this._lost(message);
      return;
    }
    this._resume(message);
  }

  async _resume(message) {
    this.reconnecting = true;
    this.dispatchEvent(new CustomEvent('state', { detail: 'reconnecting' }));
    let why = null;
    for (let attempt = 0; attempt < RESUME_ATTEMPTS; attempt += 1) {
      if (attempt) await sleep(RESUME_BACKOFF_MS * attempt);
      if (this._stopped) return;
      this._closeQuietly();
      // Tried again after a failure: if the server took it, it refuses it now (403).
      const token = this.resumeToken;
      try {
        // TURN credentials expire (transport.ice_credential_ttl_s): fresh ones for each try
        const fresh = await fetchIceServers(this.baseUrl);
        if (fresh.length) this._iceServers = fresh;
        if (this._stopped) return;
        if (!(await this._connect(token))) return; // stopped meanwhile
        this.reconnecting = false;
        this.resumes += 1;
        console.info(`call: resumed session ${this.sessionId} (attempt ${attempt + 1})`);
        this._onState();
        return;
      } catch (err) {
        if (this._stopped) return;
        why = err;
        console.warn(`call: resume attempt ${attempt + 1} failed:`, err.message);
        const status = err.detail && err.detail.status;
        if (status >= 400 && status < 500) break; // refused: the conversation cannot be resumed
      }
    }
    this._closeQuietly();
    this.reconnecting = false;
    this._lost(message, why);
  }

  /** Close the call's peer connection without it reporting anything. */
  _closeQuietly() {
    const { pc, channel } = this;
    this._unwatch();
    this.pc = null;
    this.channel = null;
    try {
      if (channel) channel.close();
      if (pc) pc.close();
    } catch {
      // closed already
    }
  }

  _lost(message, cause = null) {
    if (this._stopped) return;
    const detail = cause ? { cause: cause.message, status: cause.detail && cause.detail.status } : {};
    this.dispatchEvent(new CustomEvent('lost', { detail: new ConnectError('lost', message, detail) }));
  }

  _onMessage(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    if (!event || typeof event.type !== 'string' || this._stopped) return;
    if (typeof event.event_id === 'string') this.lastEventId = event.event_id;
    // the server's own description of the session (after GA's `session.created`) has the token
    if (event.type === 'x-avatar.session' && event.session && typeof event.session.resume_token === 'string') {
      this.resumeToken = event.session.resume_token;
      this.resumeWindowS = event.session.resume_window_s ?? null;
    }
    this.dispatchEvent(new CustomEvent('message', { detail: event }));
  }

  /** Send a client event; false when the channel is not open. */
  send(event) {
    if (!this.channel || this.channel.readyState !== 'open') return false;
    this.channel.send(JSON.stringify(event));
    return true;
  }

  async replaceMicrophone(track) {
    this._mic = track;
    if (this._audioSender) await this._audioSender.replaceTrack(track);
  }

  async replaceCamera(track) {
    this._camera = track;
    if (this._videoSender) await this._videoSender.replaceTrack(track);
  }

  _deleteSession(id) {
    if (!id) return;
    // The registry behind /whip ends any session by id, /offer ones included.
    fetch(`${this.baseUrl}/whip/${encodeURIComponent(id)}`, { method: 'DELETE', keepalive: true })
      .catch(() => {});
  }

  /** End the call: the server session first (explicitly), then the peer connection. */
  stop() {
    this._stopped = true;
    this._unwatch();
    this._deleteSession(this.sessionId);
    this.sessionId = null;
    this.resumeToken = null;
    if (this.channel) this.channel.close();
    if (this.pc) this.pc.close();
    this.remoteStream.getTracks().forEach((t) => this.remoteStream.removeTrack(t));
  }
}
