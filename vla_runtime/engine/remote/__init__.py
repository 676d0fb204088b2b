"""Remote back end (`vla-runtime serve`): one policy served to many robots over ZeroMQ.

Modules: `server` (PolicyServer), `client` (RemoteClient), `keys` (CURVE keys, API keys,
loopback test), `protocol` (errors, message bodies), `wire` (framing), `serve_cli`
(`vla-runtime serve`). openpi's websocket protocol: `openpi_protocol`, `openpi_server`
(OpenpiServer), `openpi_policy` (OpenpiPolicy, the engine's `openpi` back end), `packed`
(one-buffer msgpack with arrays, openpi's layout).

`PolicyServer` owns a ROUTER socket; each robot is a `RemoteClient` (a DEALER socket that
implements the `Policy` protocol). Messages use `wire` framing: a msgpack header plus one raw
frame per array, so camera images are never copied into msgpack.

Protocol (every header carries `v` = PROTOCOL_VERSION and a request `id`):
  hello  {expected_spec?}                     -> {spec}      version and spec are checked here
  infer  {images, state, instruction?, stamp, mode, plan?} -> {actions, stamp, mode, ...}
The server keeps a session per client identity (ROUTER routing id): infer is refused until the
client said hello, so a version or spec mismatch can never slip through; the instruction is
cached per session (sent only when it changes); and each session gets its own policy state
(KV caches, previous chunk for warm starts, noise RNG), so one robot's cached camera KV or
previous chunk never leaks into another robot's inference (see `PolicyServer`). A restarted
server has no sessions; clients notice (`handshake_required`) and say hello again.

Security: CURVE (encryption + server authentication, optional client allow-list) is mandatory
whenever the server binds anything but loopback/ipc: the server refuses to start without keys.
"""
