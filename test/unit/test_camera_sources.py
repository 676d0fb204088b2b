import numpy as np
import pytest

from vla_runtime.drivers.cameras import (
    CalibrationError,
    CameraUnavailable,
    DeviceSource,
    SimSource,
    VideoFileSource,
    load_calibration,
    output_size,
    resize_frame,
)

FRAMES, WIDTH, HEIGHT, FPS = 10, 64, 48, 20.0


def write_video(path, frames=FRAMES, width=WIDTH, height=HEIGHT, fps=FPS):
    """Frame k is uniform grey 20 * k + 10 (BGR = RGB for grey), so a read frame tells which
    one it is even after MJPG compression."""
    import cv2

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (width, height))
    assert writer.isOpened()
    for k in range(frames):
        writer.write(np.full((height, width, 3), 20 * k + 10, np.uint8))
    writer.release()
    return path


def frame_index(frame) -> int:
    return round((float(frame.mean()) - 10) / 20)


def test_video_file_loops_past_the_end(tmp_path):
    source = VideoFileSource(write_video(tmp_path / "clip.avi"))
    source.open()
    try:
        assert source.fps == pytest.approx(FPS)
        assert source.frame_count == FRAMES
        indices = []
        for _ in range(25):
            ok, frame = source.read()
            assert ok
            assert frame.shape == (HEIGHT, WIDTH, 3) and frame.dtype == np.uint8
            indices.append(frame_index(frame))
    finally:
        source.close()
    assert indices == list(range(10)) + list(range(10)) + list(range(5))


def test_video_file_without_loop_ends(tmp_path):
    source = VideoFileSource(write_video(tmp_path / "clip.avi", frames=3), loop=False)
    source.open()
    assert [source.read()[0] for _ in range(4)] == [True, True, True, False]
    source.close()
    assert source.read() == (False, None)


def test_video_file_channel_order_is_rgb(tmp_path):
    import cv2

    path = tmp_path / "red.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), FPS, (WIDTH, HEIGHT))
    writer.write(np.full((HEIGHT, WIDTH, 3), (0, 0, 255), np.uint8))  # red in OpenCV's BGR
    writer.release()
    source = VideoFileSource(path)
    source.open()
    ok, frame = source.read()
    source.close()
    assert ok
    red, green, blue = frame.reshape(-1, 3).mean(axis=0)
    assert red > 200 and green < 50 and blue < 50


def test_missing_or_broken_sources_raise_clear_errors(tmp_path):
    with pytest.raises(CameraUnavailable, match="does not exist"):
        VideoFileSource(tmp_path / "nope.avi").open()
    junk = tmp_path / "junk.avi"
    junk.write_bytes(b"not a video at all")
    with pytest.raises(CameraUnavailable):
        VideoFileSource(junk).open()
    with pytest.raises(CameraUnavailable, match="does not exist"):
        DeviceSource("/dev/video_vla_missing").open()
    assert DeviceSource("3").device == 3
    assert DeviceSource("/dev/video0").device == "/dev/video0"


def test_output_size():
    assert output_size((640, 480), 0, 0) == (640, 480)
    assert output_size((640, 480), 320, 0) == (320, 240)
    assert output_size((640, 480), 0, 120) == (160, 120)
    assert output_size((640, 480), 224, 224) == (224, 224)
    with pytest.raises(ValueError):
        output_size((640, 480), -1, 0)


def test_resize_frame_area_average():
    frame = np.zeros((4, 4, 3), np.uint8)
    frame[:2, :2] = 100  # top-left 2x2 block
    frame[0, 2] = 40  # one pixel of the top-right block
    small = resize_frame(frame, 2, 2)
    assert small.shape == (2, 2, 3)
    assert small[0, 0, 0] == 100
    assert small[0, 1, 0] == 10  # 40 / 4 averaged over its block
    assert small[1, 1, 0] == 0
    assert resize_frame(frame, 4, 4) is frame


CALIBRATION_YAML = """\
image_width: 640
image_height: 480
camera_name: wrist
camera_matrix:
  rows: 3
  cols: 3
  data: [600.0, 0.0, 320.5, 0.0, 610.0, 240.5, 0.0, 0.0, 1.0]
distortion_model: plumb_bob
distortion_coefficients:
  rows: 1
  cols: 5
  data: [0.1, -0.2, 0.001, 0.002, 0.0]
rectification_matrix:
  rows: 3
  cols: 3
  data: [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
projection_matrix:
  rows: 3
  cols: 4
  data: [590.0, 0.0, 321.0, 0.0, 0.0, 605.0, 241.0, 0.0, 0.0, 0.0, 1.0, 0.0]
"""


def test_load_calibration(tmp_path):
    path = tmp_path / "wrist.yaml"
    path.write_text(CALIBRATION_YAML)
    calib = load_calibration(path)
    assert (calib.width, calib.height, calib.camera_name) == (640, 480, "wrist")
    assert calib.K[0, 0] == 600.0 and calib.K[1, 2] == 240.5
    assert calib.D == [0.1, -0.2, 0.001, 0.002, 0.0]
    assert calib.distortion_model == "plumb_bob"
    np.testing.assert_array_equal(calib.R, np.eye(3))
    assert calib.P[0, 0] == 590.0 and calib.P.shape == (3, 4)

    half = calib.scaled_to(320, 240)
    assert (half.width, half.height) == (320, 240)
    assert half.K[0, 0] == 300.0 and half.K[0, 2] == 160.25 and half.K[1, 1] == 305.0
    assert half.P[1, 2] == 120.5
    assert half.D == calib.D


def test_calibration_defaults_when_optional_fields_missing(tmp_path):
    path = tmp_path / "minimal.yaml"
    path.write_text(
        "image_width: 100\nimage_height: 50\n"
        "camera_matrix: {rows: 3, cols: 3, data: [90, 0, 50, 0, 90, 25, 0, 0, 1]}\n"
    )
    calib = load_calibration(path)
    assert calib.D == [] and calib.distortion_model == "plumb_bob"
    np.testing.assert_array_equal(calib.P[:, :3], calib.K)
    np.testing.assert_array_equal(calib.P[:, 3], [0, 0, 0])


@pytest.mark.parametrize(
    "text, message",
    [
        ("image_width: 10\n", "image_height"),
        ("image_width: 10\nimage_height: 10\n", "camera_matrix"),
        (
            "image_width: 10\nimage_height: 10\ncamera_matrix: {rows: 3, cols: 3, data: [1, 2]}",
            "has 2 values",
        ),
        (
            "image_width: 10\nimage_height: 10\ncamera_matrix: {rows: 2, cols: 2, data: [1,2,3,4]}",
            "must be 3x3",
        ),
        (
            "image_width: 10\nimage_height: 10\n"
            "camera_matrix: {rows: 3, cols: 3, data: [1, 0, 0, 0, 1, 0, 0, 0, .nan]}",
            "non-finite",
        ),
        ("[1, 2", "not valid YAML"),
        ("- just\n- a list\n", "mapping"),
    ],
)
def test_calibration_errors(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=message):
        load_calibration(path)


def test_missing_calibration_file(tmp_path):
    with pytest.raises(CalibrationError, match="cannot read"):
        load_calibration(tmp_path / "absent.yaml")


class FakeRenderer:
    """Stands in for SceneRenderer: the frame encodes the first qpos entry."""

    def __init__(self, xml, camera, width, height):
        if camera != "scene":
            raise ValueError(f"no camera named {camera}")
        self.width, self.height = width, height

    def render(self, qpos):
        return np.full((self.height, self.width, 3), int(qpos[0]), np.uint8)

    def intrinsics(self):
        return np.array([[100.0, 0, 16], [0, 100.0, 12], [0, 0, 1]])


def test_sim_source_renders_newest_state_once():
    source = SimSource("<mujoco/>", "scene", 32, 24, renderer_cls=FakeRenderer)
    source.open()
    assert source.read() == (False, None)  # no state yet
    source.update(0.5, [7.0])
    source.update(0.6, [9.0])
    ok, frame = source.read()
    assert ok and frame.shape == (24, 32, 3) and frame[0, 0, 0] == 9
    assert source.frame_time == 0.6
    assert source.read() == (False, None)  # nothing new since
    assert source.shows(0.6, [9.0]) and not source.shows(0.6, [7.0])
    assert not source.shows(0.5, [9.0])
    assert source.intrinsics()[0, 2] == 16.0
    with pytest.raises(CameraUnavailable, match="no camera named"):
        SimSource("<mujoco/>", "wrist", 32, 24, renderer_cls=FakeRenderer).open()


def rendered(source: SimSource, times) -> list[float]:
    """The states (sim times) of `times` that `source` renders."""
    out = []
    for t in times:
        source.update(t, [1.0])
        if source.read()[0]:
            out.append(round(t, 3))
    return out


def test_sim_source_paces_frames_on_sim_time_and_renders_a_reset_at_once():
    source = SimSource("<mujoco/>", "scene", 32, 24, fps=15.0, renderer_cls=FakeRenderer)
    source.open()
    states = [0.02 * k for k in range(1, 51)]  # 50 Hz for 1 s
    frames = rendered(source, states)
    assert frames[0] == 0.02 and 14 <= len(frames) <= 16  # 15 per second of sim time
    gaps = np.diff(frames)
    assert gaps.min() >= 0.06 - 1e-9 and gaps.max() <= 0.08 + 1e-9  # on the 20 ms grid
    source.render_next()  # an episode reset: the next state is rendered at once
    assert rendered(source, [1.02, 1.04]) == [1.02]
    assert rendered(source, [0.02])  # a sim restarted from 0 starts a new schedule
    every = SimSource("<mujoco/>", "scene", 32, 24, renderer_cls=FakeRenderer)  # fps 0
    every.open()
    for t in (0.001, 0.002):
        every.update(t, [1.0])
        assert every.read()[0]


def test_sim_cameras_at_one_rate_render_the_same_states_however_they_started():
    def frames(fps: float, states) -> list[float]:
        source = SimSource("<mujoco/>", "scene", 32, 24, fps=fps, renderer_cls=FakeRenderer)
        source.open()
        return rendered(source, states)

    states = [round(0.02 * k, 3) for k in range(1, 101)]
    early, late = frames(20.0, states), frames(20.0, states[1:])  # one saw a state later
    assert early[0] == 0.02 and late[0] == 0.04
    assert early[1:] == late[1:]
    assert set(frames(10.0, states[3:])[1:]) <= set(early)  # a divisor's frames pair too
