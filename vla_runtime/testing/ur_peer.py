"""A minimal UR controller for tests of the ur_rtde driver: it speaks the controller's side of
Universal Robots' protocols on loopback, so the real ur_rtde client library connects to it.

- RTDE (TCP 30004, protocol versions 1 and 2): REQUEST_PROTOCOL_VERSION, GET_URCONTROL_VERSION,
  CONTROL_PACKAGE_SETUP_OUTPUTS / SETUP_INPUTS (recipes of named variables, NOT_FOUND / IN_USE
  as the controller answers them), CONTROL_PACKAGE_START / PAUSE, DATA_PACKAGE both ways at
  the requested frequency, TEXT_MESSAGE from a client (logged).
- Dashboard server (TCP 29999): the text commands ur_rtde's DashboardClient sends (see
  `_dashboard_reply`), answered with the controller's reply strings.
- Primary / secondary / real-time interfaces (TCP 30001 / 30002 / 30003): take URScript text. A
  program (`def name(): ... end`) replaces the running one; sends nothing back.

ur_rtde's RTDEControlInterface uploads its control script, which runs on the controller and
takes commands through RTDE registers: input_int_register_0 is the command, input double
registers its arguments; output_int_register_0 says 1 (ready for a command) or 2 (done with
it). This peer does not interpret URScript: it recognises that script and plays its side of the
register protocol, cycle by cycle as the script's main loop does (real-time commands such as
servoJ are taken and answered "ready" at once; others are answered "done" until the client
clears the command). servoJ targets are followed by a first-order lag (time constant: the
lookahead time) capped at each joint's speed, both scaled by the speed slider times the runtime
speed scaling; servoStop / stopJ / stopL / speedStop halt the arm; stopScript ends the program.
Other commands are acknowledged and listed in `unsupported`; the TCP quantities are zeros.

A protective stop (`protective_stop()`) does what the controller does to a script program: it
ends the program, stops the arm and reports the stop in RTDE (safety_status_bits, safety_mode)
and on the dashboard until unlocked ("unlock protective stop", refused before
`unlock_delay_s`, 5 s on the controller).

Each peer binds its own 127.0.0.N on the default ports (ur_rtde takes an address, not ports),
so tests do not collide.
"""

from __future__ import annotations

import errno
import math
import random
import re
import selectors
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DASHBOARD_PORT, PRIMARY_PORT, SECONDARY_PORT, REALTIME_PORT, RTDE_PORT = (
    29999, 30001, 30002, 30003, 30004,
)  # fmt: skip
SCRIPT_PORTS = (PRIMARY_PORT, SECONDARY_PORT, REALTIME_PORT)
CONTROL_PERIOD_S = 0.002  # e-Series controller: 500 Hz

# RTDE package types (RTDE guide: "RTDE client protocol").
REQUEST_PROTOCOL_VERSION = ord("V")
GET_URCONTROL_VERSION = ord("v")
TEXT_MESSAGE = ord("M")
DATA_PACKAGE = ord("U")
SETUP_OUTPUTS = ord("O")
SETUP_INPUTS = ord("I")
START = ord("S")
PAUSE = ord("P")
HEADER = struct.Struct(">HB")  # package size including the header, package type

FORMATS = {
    "BOOL": "?", "UINT8": "B", "UINT32": "I", "UINT64": "Q", "INT32": "i", "DOUBLE": "d",
    "VECTOR3D": "3d", "VECTOR6D": "6d", "VECTOR6INT32": "6i", "VECTOR6UINT32": "6I",
}  # fmt: skip
_V6 = "VECTOR6D"
# Controller outputs (RTDE guide, PolyScope 5.x), besides the registers.
OUTPUT_TYPES = {
    "timestamp": "DOUBLE", "target_q": _V6, "target_qd": _V6, "target_qdd": _V6,
    "target_current": _V6, "target_moment": _V6, "actual_q": _V6, "actual_qd": _V6,
    "actual_current": _V6, "actual_current_as_torque": _V6, "joint_control_output": _V6,
    "actual_TCP_pose": _V6, "actual_TCP_speed": _V6, "actual_TCP_force": _V6,
    "target_TCP_pose": _V6, "target_TCP_speed": _V6, "actual_digital_input_bits": "UINT64",
    "joint_temperatures": _V6, "actual_execution_time": "DOUBLE", "robot_mode": "INT32",
    "joint_mode": "VECTOR6INT32", "safety_mode": "INT32", "safety_status": "INT32",
    "actual_tool_accelerometer": "VECTOR3D", "speed_scaling": "DOUBLE",
    "target_speed_fraction": "DOUBLE", "actual_momentum": "DOUBLE",
    "actual_main_voltage": "DOUBLE", "actual_robot_voltage": "DOUBLE",
    "actual_robot_current": "DOUBLE", "actual_joint_voltage": _V6,
    "actual_digital_output_bits": "UINT64", "runtime_state": "UINT32",
    "elbow_position": "VECTOR3D", "elbow_velocity": "VECTOR3D", "robot_status_bits": "UINT32",
    "safety_status_bits": "UINT32", "analog_io_types": "UINT32",
    "standard_analog_input0": "DOUBLE", "standard_analog_input1": "DOUBLE",
    "standard_analog_output0": "DOUBLE", "standard_analog_output1": "DOUBLE",
    "io_current": "DOUBLE", "euromap67_input_bits": "UINT32",
    "euromap67_output_bits": "UINT32", "tool_mode": "UINT32", "tool_output_voltage": "INT32",
    "tool_output_current": "DOUBLE", "tool_temperature": "DOUBLE",
    "tool_analog_input0": "DOUBLE", "tool_analog_input1": "DOUBLE",
    "output_bit_registers0_to_31": "UINT32", "output_bit_registers32_to_63": "UINT32",
    "input_bit_registers0_to_31": "UINT32", "input_bit_registers32_to_63": "UINT32",
    "ft_raw_wrench": _V6, "payload": "DOUBLE", "payload_cog": "VECTOR3D",
    "payload_inertia": _V6, "script_control_line": "UINT32",
}  # fmt: skip
INPUT_TYPES = {
    "speed_slider_mask": "UINT32", "speed_slider_fraction": "DOUBLE",
    "standard_digital_output_mask": "UINT8", "standard_digital_output": "UINT8",
    "configurable_digital_output_mask": "UINT8", "configurable_digital_output": "UINT8",
    "tool_digital_output_mask": "UINT8", "tool_digital_output": "UINT8",
    "standard_analog_output_mask": "UINT8", "standard_analog_output_type": "UINT8",
    "standard_analog_output_0": "DOUBLE", "standard_analog_output_1": "DOUBLE",
    "input_bit_registers0_to_31": "UINT32", "input_bit_registers32_to_63": "UINT32",
    "external_force_torque": _V6,
}  # fmt: skip
_REGISTER = re.compile(r"(input|output)_(int|double|bit)_register_(\d+)$")
_REGISTER_TYPES = {"int": "INT32", "double": "DOUBLE", "bit": "BOOL"}


def variable_type(name: str, direction: str) -> str:
    """The RTDE type of an output ("output") or input ("input") variable, or "NOT_FOUND"."""
    match = _REGISTER.match(name)
    if match:
        side, kind, index = match.group(1), match.group(2), int(match.group(3))
        # Bit registers 64..127, int and double registers 0..47 are the general purpose ones.
        in_range = 64 <= index <= 127 if kind == "bit" else 0 <= index <= 47
        if in_range and (side == direction or direction == "output"):
            return _REGISTER_TYPES[kind]
        return "NOT_FOUND"
    table = OUTPUT_TYPES if direction == "output" else INPUT_TYPES
    return table.get(name, "NOT_FOUND")


# RTDE enumerations (RTDE guide; ur_rtde's RuntimeState / SafetyStatus).
RUNTIME_STOPPED, RUNTIME_PLAYING = 1, 2
ROBOT_MODES = {3: "POWER_OFF", 5: "IDLE", 7: "RUNNING"}
ROBOT_MODE_POWER_OFF, ROBOT_MODE_IDLE, ROBOT_MODE_RUNNING = 3, 5, 7
SAFETY_NORMAL, SAFETY_PROTECTIVE_STOP = 1, 3
SAFETY_MODE_NAMES = {SAFETY_NORMAL: "NORMAL", SAFETY_PROTECTIVE_STOP: "PROTECTIVE_STOP"}
NORMAL_MODE_BIT, PROTECTIVE_STOPPED_BIT = 1 << 0, 1 << 2
POWER_ON_BIT, PROGRAM_RUNNING_BIT = 1 << 0, 1 << 1
JOINT_MODE_RUNNING = 253

# The commands of ur_rtde's control script (ur_rtde RTDE::RobotCommand::Type).
NO_CMD, SPEEDJ, SPEEDL, SERVOJ = 0, 9, 10, 11
SPEED_STOP, SERVO_STOP, STOPL, STOPJ, STOP_SCRIPT = 15, 16, 33, 34, 255
# The script takes these each cycle and stays "ready"; any other command it runs once, answers
# "done" and waits for the client to clear it.
REALTIME_COMMANDS = frozenset({6, 9, 10, 11, 24, 25, 26, 27, 38, 58})
HALTING_COMMANDS = frozenset({SPEED_STOP, SERVO_STOP, STOPL, STOPJ})
READY, DONE = 1, 2
CONTROL_SCRIPT_MARK = "RTDE Control Script"  # in the textmsg the script's main loop starts with

POLYSCOPE_VERSION = "URSoftware 5.11.1.108318 (Nov 04 2021)"
URCONTROL_VERSION = (5, 11, 1, 108318)
SERIAL_NUMBER = "20185500001"
# Dashboard commands whose reply does not depend on the controller's state.
FIXED_DASHBOARD_REPLIES = {
    "PolyscopeVersion": POLYSCOPE_VERSION,
    "get serial number": SERIAL_NUMBER,
    "get robot model": "UR5",
    "is in remote control": "true",
    "get loaded program": "No program loaded",
    "close safety popup": "closing safety popup",
    "close popup": "closing popup",
    "restart safety": "Restarting safety",
    "quit": "Disconnected",
}
UNLOCK_TOO_EARLY = (
    "Cannot unlock protective stop until 5s after occurrence. Always inspect cause of "
    "protective stop before unlocking"
)


@dataclass(frozen=True)
class Command:
    """A command the control interface wrote to the input registers (one DATA_PACKAGE)."""

    t: float  # time.monotonic() at receipt
    kind: int  # input_int_register_0
    ints: tuple[int, ...]  # input_int_register_1.. as sent (those in the recipe)
    doubles: tuple[float, ...]  # input_double_register_0.. as sent

    @property
    def servo_target(self) -> np.ndarray:
        return np.array(self.doubles[:6])


@dataclass
class _Program:
    """The running URScript program: ur_rtde's control script, or another one (no effect)."""

    name: str
    control_script: bool
    int_offset: int = 0
    double_offset: int = 0
    executing: bool = False  # a non-real-time command was run and is not cleared yet


@dataclass
class _Rtde:
    sock: socket.socket
    buffer: bytearray = field(default_factory=bytearray)
    protocol: int = 1
    outputs: list[str] = field(default_factory=list)
    output_types: list[str] = field(default_factory=list)
    output_recipe: int = 0
    every: int = 1  # send every n-th control cycle
    inputs: dict[int, tuple[list[str], struct.Struct]] = field(default_factory=dict)
    started: bool = False
    send_lock: threading.Lock = field(default_factory=threading.Lock)


def _pack(fmt: str, value) -> bytes:
    if len(fmt) > 1:
        return struct.pack(">" + fmt, *value)
    return struct.pack(">" + fmt, value)


class URPeer:
    """The peer on 127.0.0.N (`host`), started on construction; `close()` ends it.

    `q0`: the initial joint positions; `joint_speed_max`: rad/s per joint (the controller caps
    servo motion at it). Everything the clients sent is recorded: `commands` (every register
    command, in order), `scripts`, `dashboard` (command, reply), `unsupported`."""

    def __init__(
        self,
        q0: Sequence[float],
        joint_speed_max: Sequence[float] = (math.pi,) * 6,
        unlock_delay_s: float = 5.0,
        host: str | None = None,
    ):
        self.q = np.array(q0, dtype=float)
        self.qd = np.zeros(6)
        self.vmax = np.array(joint_speed_max, dtype=float)
        self.unlock_delay_s = unlock_delay_s
        self.slider = 1.0  # target_speed_fraction: the pendant's speed slider
        self.runtime_scaling = 1.0  # speed_scaling: the controller's own slow-down
        self.robot_mode = ROBOT_MODE_RUNNING
        self.safety_mode = SAFETY_NORMAL
        self.stopped_at: float | None = None
        self.program: _Program | None = None
        self.commands: list[Command] = []
        self.scripts: list[str] = []
        self.dashboard: list[tuple[str, str]] = []
        self.unsupported: list[int] = []
        self.text_messages: list[str] = []
        self._servo: Command | None = None
        self._inputs: dict[str, object] = {}
        self._input_owner: dict[str, _Rtde] = {}
        self._out_int = [0] * 48
        self._out_double = [0.0] * 48
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._selector = selectors.DefaultSelector()
        self._rtde: list[_Rtde] = []
        self._closing = False
        self.host, self._listeners = self._bind(host)
        for port, listener in self._listeners.items():
            self._selector.register(listener, selectors.EVENT_READ, ("listen", port))
        self._io = threading.Thread(target=self._serve, name="ur_peer_io", daemon=True)
        self._cycle = threading.Thread(target=self._run_cycles, name="ur_peer_ctrl", daemon=True)
        self._io.start()
        self._cycle.start()

    # -- what a test does to the controller ----------------------------------------------
    def protective_stop(self) -> None:
        """A protective stop, as the safety system raises one: the program ends, the arm halts."""
        with self._lock:
            self.safety_mode = SAFETY_PROTECTIVE_STOP
            self.stopped_at = time.monotonic()
            self._end_program()

    def set_speed(self, slider: float | None = None, runtime: float | None = None) -> None:
        """Move the pendant's speed slider and/or the controller's runtime speed scaling."""
        with self._lock:
            if slider is not None:
                self.slider = float(slider)
            if runtime is not None:
                self.runtime_scaling = float(runtime)

    @property
    def program_running(self) -> bool:
        with self._lock:
            return self.program is not None

    def servo_commands(self) -> list[Command]:
        with self._lock:
            return [c for c in self.commands if c.kind == SERVOJ]

    def close(self) -> None:
        self._closing = True
        self._cycle.join(timeout=2.0)
        self._io.join(timeout=2.0)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self._selector.close()

    def __enter__(self) -> URPeer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- sockets ---------------------------------------------------------------------------
    @staticmethod
    def _bind(host: str | None) -> tuple[str, dict[int, socket.socket]]:
        """Listeners on every port at `host`, or at the first 127.0.0.N where all are free."""
        candidates = [host] if host else [f"127.0.0.{n}" for n in random.sample(range(2, 255), 253)]
        ports = (DASHBOARD_PORT, *SCRIPT_PORTS, RTDE_PORT)
        for address in candidates:
            bound: dict[int, socket.socket] = {}
            try:
                for port in ports:
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    bound[port] = sock
                    sock.bind((address, port))
                    sock.listen(8)
                    sock.setblocking(False)
                return address, bound
            except OSError as exc:
                for sock in bound.values():
                    sock.close()
                if exc.errno != errno.EADDRINUSE or host:
                    raise
        raise OSError(errno.EADDRINUSE, "no 127.0.0.N with the UR ports free")

    def _serve(self) -> None:
        while not self._closing:
            for key, _ in self._selector.select(timeout=0.05):
                role, port = key.data[:2]
                if role == "listen":
                    self._accept(key.fileobj, port)
                    continue
                try:
                    data = key.fileobj.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self._drop(key.fileobj)
                elif port == RTDE_PORT:
                    self._on_rtde(key.data[2], data)
                elif port == DASHBOARD_PORT:
                    self._on_dashboard(key, data)
                else:
                    self._on_script(key, data)

    def _accept(self, listener: socket.socket, port: int) -> None:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(True)
        sock.settimeout(2.0)  # a client that stops reading is dropped, not waited for
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if port == RTDE_PORT:
            conn = _Rtde(sock)
            with self._lock:
                self._rtde.append(conn)
            self._selector.register(sock, selectors.EVENT_READ, ("conn", port, conn))
        else:
            self._selector.register(sock, selectors.EVENT_READ, ("conn", port, bytearray()))
            if port == DASHBOARD_PORT:
                self._send(sock, b"Connected: Universal Robots Dashboard Server\n")

    def _drop(self, sock: socket.socket) -> None:
        key = self._selector.unregister(sock)
        if key.data[1] == RTDE_PORT:
            conn = key.data[2]
            with self._lock, conn.send_lock:
                conn.started = False
                self._rtde.remove(conn)
                for name in [n for n, owner in self._input_owner.items() if owner is conn]:
                    del self._input_owner[name]
        sock.close()

    @staticmethod
    def _send(sock: socket.socket, data: bytes) -> bool:
        try:
            sock.sendall(data)
            return True
        except OSError:
            return False

    # -- RTDE ------------------------------------------------------------------------------
    def _on_rtde(self, conn: _Rtde, data: bytes) -> None:
        conn.buffer += data
        while len(conn.buffer) >= HEADER.size:
            size, kind = HEADER.unpack_from(conn.buffer)
            if size < HEADER.size:  # not RTDE: nothing sensible can follow
                conn.buffer.clear()
                return
            if len(conn.buffer) < size:
                return
            payload = bytes(conn.buffer[HEADER.size : size])
            del conn.buffer[:size]
            reply = self._rtde_reply(conn, kind, payload)
            if reply is not None:
                with conn.send_lock:
                    self._send(conn.sock, HEADER.pack(HEADER.size + len(reply), kind) + reply)

    def _rtde_reply(self, conn: _Rtde, kind: int, payload: bytes) -> bytes | None:
        if kind == REQUEST_PROTOCOL_VERSION:
            (version,) = struct.unpack(">H", payload[:2])
            accepted = version in (1, 2)
            if accepted:
                conn.protocol = version
            return struct.pack(">B", accepted)
        if kind == GET_URCONTROL_VERSION:
            return struct.pack(">4I", *URCONTROL_VERSION)
        if kind == SETUP_OUTPUTS:
            return self._setup_outputs(conn, payload)
        if kind == SETUP_INPUTS:
            return self._setup_inputs(conn, payload)
        if kind == START:
            with conn.send_lock:
                conn.started = bool(conn.outputs)
                return struct.pack(">B", conn.started)
        if kind == PAUSE:
            with conn.send_lock:
                conn.started = False
            return struct.pack(">B", 1)
        if kind == DATA_PACKAGE:
            self._on_inputs(conn, payload)
        elif kind == TEXT_MESSAGE:
            self.text_messages.append(payload.decode(errors="replace"))
        return None

    def _setup_outputs(self, conn: _Rtde, payload: bytes) -> bytes:
        frequency = 125.0
        if conn.protocol == 2:
            (frequency,) = struct.unpack(">d", payload[:8])
            payload = payload[8:]
        names = [n for n in payload.decode().split(",") if n]
        types = [variable_type(n, "output") for n in names]
        with conn.send_lock:
            ok = bool(names) and "NOT_FOUND" not in types and 0 < frequency <= 500
            conn.outputs, conn.output_types = (names, types) if ok else ([], [])
            conn.every = max(1, round(1.0 / (frequency * CONTROL_PERIOD_S))) if ok else 1
            conn.output_recipe = 1 if ok else 0
        text = ",".join(types).encode()
        return (struct.pack(">B", conn.output_recipe) + text) if conn.protocol == 2 else text

    def _setup_inputs(self, conn: _Rtde, payload: bytes) -> bytes:
        names = [n for n in payload.decode().split(",") if n]
        with self._lock:
            types = [
                variable_type(n, "input") if self._input_owner.get(n, conn) is conn else "IN_USE"
                for n in names
            ]
            recipe = 0
            if names and not {"NOT_FOUND", "IN_USE"} & set(types):
                recipe = len(conn.inputs) + 1
                fmt = ">B" + "".join(FORMATS[t] for t in types)
                conn.inputs[recipe] = (names, struct.Struct(fmt))
                for name in names:
                    self._input_owner[name] = conn
        return struct.pack(">B", recipe) + ",".join(types).encode()

    def _on_inputs(self, conn: _Rtde, payload: bytes) -> None:
        if not payload or payload[0] not in conn.inputs:
            return
        names, layout = conn.inputs[payload[0]]
        if len(payload) != layout.size:
            return
        flat = list(layout.unpack(payload)[1:])
        values = {}
        for name in names:
            width = int(FORMATS[variable_type(name, "input")][:-1] or 1)
            values[name] = flat[0] if width == 1 else tuple(flat[:width])
            del flat[:width]
        now = time.monotonic()
        with self._lock:
            self._inputs.update(values)
            if values.get("speed_slider_mask") == 1:
                self.slider = float(values.get("speed_slider_fraction", self.slider))
            program = self.program
            offset = program.int_offset if program else 0
            kind = values.get(f"input_int_register_{offset}")
            if kind is not None:
                ints, doubles = self._registers(values, offset, program)
                self.commands.append(Command(now, int(kind), ints, doubles))

    @staticmethod
    def _registers(values: dict, int_offset: int, program: _Program | None):
        """The int registers after the command's and the double registers, as far as given."""
        double_offset = program.double_offset if program else 0
        ints, doubles = [], []
        for i in range(int_offset + 1, 48):
            if f"input_int_register_{i}" not in values:
                break
            ints.append(int(values[f"input_int_register_{i}"]))
        for i in range(double_offset, 48):
            if f"input_double_register_{i}" not in values:
                break
            doubles.append(float(values[f"input_double_register_{i}"]))
        return tuple(ints), tuple(doubles)

    # -- the control cycle ---------------------------------------------------------------
    def _run_cycles(self) -> None:
        cycle, last = 0, time.monotonic()
        deadline = last
        while not self._closing:
            deadline += CONTROL_PERIOD_S
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -4 * CONTROL_PERIOD_S:
                deadline = time.monotonic()  # fell behind: no burst of catch-up cycles
            now = time.monotonic()
            with self._lock:
                self._script_step()
                self._move(min(now - last, 4 * CONTROL_PERIOD_S))
                values = self._outputs(now)
                due = [c for c in self._rtde if c.started and cycle % c.every == 0]
            last = now
            for conn in due:
                self._send_outputs(conn, values)
            cycle += 1

    def _send_outputs(self, conn: _Rtde, values: dict) -> None:
        with conn.send_lock:
            if not conn.started:
                return
            body = struct.pack(">B", conn.output_recipe) if conn.protocol == 2 else b""
            for name, kind in zip(conn.outputs, conn.output_types, strict=True):
                body += _pack(FORMATS[kind], values(name))
            if not self._send(conn.sock, HEADER.pack(HEADER.size + len(body), DATA_PACKAGE) + body):
                conn.started = False

    def _outputs(self, now: float):
        """The values of this cycle, by name (a function: registers are looked up on demand)."""
        zeros6, zeros3 = (0.0,) * 6, (0.0,) * 3
        program = self.program is not None
        stopped = self.safety_mode == SAFETY_PROTECTIVE_STOP
        scaling = self.runtime_scaling if self.robot_mode == ROBOT_MODE_RUNNING else 0.0
        fixed = {
            "timestamp": now - self._t0, "target_q": tuple(self.q), "target_qd": tuple(self.qd),
            "actual_q": tuple(self.q), "actual_qd": tuple(self.qd),
            "actual_digital_input_bits": 0, "actual_digital_output_bits": 0,
            "joint_temperatures": (30.0,) * 6, "actual_execution_time": 0.2,
            "robot_mode": self.robot_mode, "safety_mode": self.safety_mode,
            "safety_status": self.safety_mode,
            "joint_mode": (JOINT_MODE_RUNNING,) * 6, "speed_scaling": scaling,
            "target_speed_fraction": self.slider, "actual_main_voltage": 48.0,
            "actual_robot_voltage": 48.0, "actual_joint_voltage": (48.0,) * 6,
            "runtime_state": RUNTIME_PLAYING if program else RUNTIME_STOPPED,
            "robot_status_bits": (POWER_ON_BIT if self.robot_mode != ROBOT_MODE_POWER_OFF
                                  else 0) | (PROGRAM_RUNNING_BIT if program else 0),
            "safety_status_bits": NORMAL_MODE_BIT | (PROTECTIVE_STOPPED_BIT if stopped else 0),
            "tool_mode": 0, "tool_output_voltage": 0,
        }  # fmt: skip
        out_int, out_double = list(self._out_int), list(self._out_double)
        inputs = dict(self._inputs)

        def value(name: str):
            if name in fixed:
                return fixed[name]
            match = _REGISTER.match(name)
            if match:
                side, kind, index = match.group(1), match.group(2), int(match.group(3))
                if side == "output":
                    return {"int": out_int, "double": out_double}.get(kind, [False] * 128)[index]
                return inputs.get(name, 0)
            kind = OUTPUT_TYPES[name]
            if kind in ("VECTOR6D", "VECTOR3D"):
                return zeros6 if kind == "VECTOR6D" else zeros3
            return 0.0 if kind == "DOUBLE" else 0

        return value

    def _script_step(self) -> None:
        """One cycle of ur_rtde's control-script main loop: take the command register."""
        program = self.program
        if program is None or not program.control_script:
            return
        off = program.int_offset
        cmd = int(self._inputs.get(f"input_int_register_{off}", NO_CMD))
        if cmd in REALTIME_COMMANDS:
            self._run(cmd, program)
            self._out_int[off] = READY
        elif cmd == NO_CMD:
            program.executing = False
            self._out_int[off] = READY
        elif not program.executing:
            program.executing = True
            if self._run(cmd, program):
                self._out_int[off] = DONE

    def _run(self, cmd: int, program: _Program) -> bool:
        """Carry out one command; False when it ended the program."""
        doubles = [
            float(self._inputs.get(f"input_double_register_{program.double_offset + i}", 0.0))
            for i in range(11)
        ]  # fmt: skip
        if cmd == SERVOJ:
            self._servo = Command(time.monotonic(), cmd, (), tuple(doubles))
        elif cmd in HALTING_COMMANDS:
            self._halt()
        elif cmd == STOP_SCRIPT:
            self._end_program()
            return False
        else:
            self.unsupported.append(cmd)
        return True

    def _halt(self) -> None:
        self._servo = None
        self.qd = np.zeros(6)

    def _end_program(self) -> None:
        self.program = None
        self._halt()

    def _move(self, dt: float) -> None:
        """Follow the servo target: a first-order lag over the lookahead time, each joint's
        speed capped; the slider and the runtime scaling slow both down."""
        scale = min(max(self.slider * self.runtime_scaling, 0.0), 1.0)
        if (
            self._servo is None
            or self.robot_mode != ROBOT_MODE_RUNNING
            or self.safety_mode != SAFETY_NORMAL
            or dt <= 0.0
        ):
            self.qd = np.zeros(6)
            return
        lookahead = max(self._servo.doubles[9], CONTROL_PERIOD_S)
        step = (self._servo.servo_target - self.q) * min(1.0, dt * scale / lookahead)
        cap = self.vmax * dt * scale
        step = np.clip(step, -cap, cap)
        self.q = self.q + step
        self.qd = step / dt

    # -- script interfaces ---------------------------------------------------------------
    def _on_script(self, key, data: bytes) -> None:
        text = key.data[2]
        text += data
        # A program is complete at its top-level "end"; a script command (not "def") is run
        # line by line by the controller, which this peer only records.
        decoded = text.decode(errors="replace")
        if not decoded.lstrip().startswith(("def ", "sec ")):
            if decoded.endswith("\n"):
                with self._lock:
                    self.scripts.append(decoded)
                text.clear()
            return
        if re.search(r"^end\s*$", decoded, re.MULTILINE) is None:
            return
        text.clear()
        self._start_program(decoded)

    def _start_program(self, script: str) -> None:
        name = re.match(r"\s*(?:def|sec)\s+(\w+)", script)
        offsets = [
            int(m.group(1)) if m else 0
            for m in (
                re.search(r"reg_offset_float\s*=\s*(\d+)", script),
                re.search(r"reg_offset_int\s*=\s*(\d+)", script),
            )
        ]  # fmt: skip
        with self._lock:
            self.scripts.append(script)
            if self.safety_mode != SAFETY_NORMAL or self.robot_mode != ROBOT_MODE_RUNNING:
                return  # the controller refuses to start a program then
            self._halt()
            self.program = _Program(
                name.group(1) if name else "", CONTROL_SCRIPT_MARK in script,
                int_offset=offsets[1], double_offset=offsets[0],
            )  # fmt: skip
            if self.program.control_script:
                self._out_int[offsets[1]] = READY  # the script's first act

    # -- dashboard server ----------------------------------------------------------------
    def _on_dashboard(self, key, data: bytes) -> None:
        buffer = key.data[2]
        buffer += data
        while b"\n" in buffer:
            line, _, rest = bytes(buffer).partition(b"\n")
            buffer[:] = rest
            command = line.decode(errors="replace").strip()
            reply = self._dashboard_reply(command)
            with self._lock:
                self.dashboard.append((command, reply))
            self._send(key.fileobj, reply.encode() + b"\n")
            if command == "quit":
                self._drop(key.fileobj)
                return

    def _dashboard_reply(self, command: str) -> str:
        with self._lock:
            running = self.program is not None
            stopped = self.safety_mode == SAFETY_PROTECTIVE_STOP
            safety = SAFETY_MODE_NAMES[self.safety_mode]
            if command in FIXED_DASHBOARD_REPLIES:
                return FIXED_DASHBOARD_REPLIES[command]
            if command == "robotmode":
                return f"Robotmode: {ROBOT_MODES[self.robot_mode]}"
            if command == "safetystatus":
                return f"Safetystatus: {safety}"
            if command == "safetymode":
                return f"Safetymode: {safety}"
            if command == "programState":
                state, name = ("PLAYING", self.program.name) if running else ("STOPPED", "")
                return f"{state} {name or '<unnamed>'}"
            if command == "running":
                return f"Program running: {'true' if running else 'false'}"
            if command == "unlock protective stop":
                if stopped and time.monotonic() - self.stopped_at < self.unlock_delay_s:
                    return UNLOCK_TOO_EARLY
                self.safety_mode, self.stopped_at = SAFETY_NORMAL, None
                return "Protective stop releasing"
            if command == "power on":
                if self.robot_mode == ROBOT_MODE_POWER_OFF:
                    self.robot_mode = ROBOT_MODE_IDLE
                return "Powering on"
            if command == "power off":
                self.robot_mode = ROBOT_MODE_POWER_OFF
                self._end_program()
                return "Powering off"
            if command == "brake release":
                if self.robot_mode == ROBOT_MODE_IDLE:
                    self.robot_mode = ROBOT_MODE_RUNNING
                return "Brake releasing"
            if command == "stop":
                if not running:
                    return "Failed to execute: stop"
                self._end_program()
                return "Stopped"
            if command in ("play", "pause"):
                return f"Failed to execute: {command}"  # no installation program is loaded
            return f"could not understand: '{command}'"


def dashboard_command(host: str, command: str, timeout: float = 5.0) -> str:
    """Send one dashboard command to `host` (as an operator's tool would); returns the reply."""
    with socket.create_connection((host, DASHBOARD_PORT), timeout=timeout) as sock:
        reader = sock.makefile("rb")
        reader.readline()  # the greeting
        sock.sendall(command.encode() + b"\n")
        return reader.readline().decode().strip()
