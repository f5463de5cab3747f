// One WebRTC session with the avatar server: local media, offer/answer over POST /offer, the
// `events` data channel. Every failure becomes a ConnectError with a `kind` the page explains.

const GATHER_TIMEOUT_MS = 3000;
const OFFER_TIMEOUT_MS = 15000;
const ICE_SERVERS_TIMEOUT_MS = 3000;
const CONNECT_TIMEOUT_MS = 15000;

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

async function postOffer(baseUrl, offer) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), OFFER_TIMEOUT_MS);
  let response;
  try {
    response = await fetch(`${baseUrl}/offer`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ sdp: offer.sdp, type: offer.type }),
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
    );
  }
  return body;
}

/**
 * A call: `start()` connects; events: 'message' (detail: a server event object), 'state'
 * (detail: the RTCPeerConnection state), 'lost' (detail: ConnectError), 'track' (detail: stream).
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
    this._audioSender = null;
    this._videoSender = null;
    this._stopped = false;
  }

  /** Connect with the microphone track `mic` and an optional camera track. */
  async start(mic, camera = null) {
    const iceServers = await fetchIceServers(this.baseUrl);
    if (this._stopped) return;
    const pc = new RTCPeerConnection({ iceServers });
    this.pc = pc;
    const channel = pc.createDataChannel('events', { ordered: true });
    this.channel = channel;
    const local = new MediaStream([mic]);
    this._audioSender = pc.addTransceiver(mic, { direction: 'sendrecv', streams: [local] }).sender;
    // Always send-capable, so a camera can be switched on later without renegotiation.
    const video = pc.addTransceiver(camera || 'video', { direction: 'sendrecv' });
    this._videoSender = video.sender;
    pc.addEventListener('track', (event) => {
      if (!this.remoteStream.getTracks().includes(event.track)) {
        this.remoteStream.addTrack(event.track);
      }
      this.dispatchEvent(new CustomEvent('track', { detail: this.remoteStream }));
    });
    channel.addEventListener('message', (event) => this._onMessage(event.data));
    const opened = new Promise((resolve) => channel.addEventListener('open', resolve, { once: true }));

    await pc.setLocalDescription(await pc.createOffer());
    await waitForGathering(pc, GATHER_TIMEOUT_MS);
    if (this._stopped) return;
    const answer = await postOffer(this.baseUrl, pc.localDescription);
    if (this._stopped) {
      this._deleteSession(answer.session_id);
      return;
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
        if (pc.connectionState === 'failed') {
          reject(new ConnectError('lost', 'The media connection to the server failed.'));
        }
      });
    });
    try {
      await Promise.race([opened, timeout, failed]);
    } finally {
      clearTimeout(timer);
    }
    pc.addEventListener('connectionstatechange', () => this._onState());
    channel.addEventListener('close', () => this._lost('The server closed the conversation.'));
    this._onState();
  }

  _onState() {
    const state = this.pc ? this.pc.connectionState : 'closed';
    this.dispatchEvent(new CustomEvent('state', { detail: state }));
    if (state === 'failed') this._lost('The connection to the server was lost.');
  }

  _lost(message) {
    if (this._stopped) return;
    this.dispatchEvent(new CustomEvent('lost', { detail: new ConnectError('lost', message) }));
  }

  _onMessage(data) {
    let event;
    try {
      event = JSON.parse(data);
    } catch {
      return;
    }
    if (event && typeof event.type === 'string') {
      this.dispatchEvent(new CustomEvent('message', { detail: event }));
    }
  }

  /** Send a client event; false when the channel is not open. */
  send(event) {
    if (!this.channel || this.channel.readyState !== 'open') return false;
    this.channel.send(JSON.stringify(event));
    return true;
  }

  async replaceMicrophone(track) {
    if (this._audioSender) await this._audioSender.replaceTrack(track);
  }

  async replaceCamera(track) {
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
    this._deleteSession(this.sessionId);
    this.sessionId = null;
    if (this.channel) this.channel.close();
    if (this.pc) this.pc.close();
    this.remoteStream.getTracks().forEach((t) => this.remoteStream.removeTrack(t));
  }
}
