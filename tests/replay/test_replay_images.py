"""`tangram replay` of a trace whose sessions name an environment image (issue 17, item 6): the
trace field is validated (file:line: field, exit 2), an image without a path fails before
anything runs, and the replay opens the sessions in the image (a tiny root file system of this
machine's programs and its system python3, built in the test; the Debian-built SWE image is in
tests/e2e). The simulator side (`--predict`) sees the image only as the session's warm key."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from arl_tangram.cli.main import main
from arl_tangram.managers.cpu.images import imagekit
from arl_tangram.replay import driver
from arl_tangram.sim.trace import load_trace, trajectory_json

pytestmark = pytest.mark.needs_root

TRACE = [
    {"id": "img", "task": "swe", "sessions": {"repo": {"demand": {"memory_mb": 256}, "image": "pymini"}},
     "steps": [[0.02, {"kind": "tool", "work_s": 0.02, "session": "repo"}],
               [0.02, {"kind": "tool", "work_s": 0.02, "session": "repo"}]]},
    {"id": "host", "task": "code", "steps": [[0.02, {"kind": "code", "work_s": 0.02}]]},
]


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def py_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("pyimg")
    root = imagekit.host_rootfs(str(d / "rootfs"))
    if imagekit.add_host_python(root) is None:
        pytest.skip("no system python3 to put in the image")
    return imagekit.pack_layer(root, str(d / "pymini.tar"))


def _cluster(tmp_path: Path, images: str = "") -> str:
    p = tmp_path / "cluster.yaml"
    p.write_text("nodes:\n  - name: local\n    capacity: {cpu: 2, memory_mb: 4096}\n"
                 "calibration: {units_per_s: 5000}\n" + images)
    return str(p)


def test_trace_session_image_round_trips_and_is_validated(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    trace = _write(tmp_path / "t.jsonl", TRACE)
    [t, _] = load_trace(trace)
    assert t.sessions["repo"].image == "pymini"
    assert trajectory_json(t)["sessions"]["repo"]["image"] == "pymini"
    bad = [TRACE[1], {**TRACE[0], "sessions": {"repo": {"image": "../etc"}}}]
    rc = main(["replay", "--trace", _write(tmp_path / "bad.jsonl", bad),
               "--cluster", _cluster(tmp_path), "--policy", "tangram"])
    assert rc == 2 and "bad.jsonl:2: sessions.repo.image" in capsys.readouterr().err
    t0 = time.perf_counter()
    rc = main(["replay", "--trace", trace, "--cluster", _cluster(tmp_path), "--policy", "tangram"])
    err = capsys.readouterr().err
    assert rc == 2 and "t.jsonl:1: sessions.repo.image" in err and "--image pymini=PATH" in err
    assert time.perf_counter() - t0 < 5  # nothing started
    rc = main(["replay", "--trace", trace, "--cluster", _cluster(tmp_path), "--policy", "tangram",
               "--image", "pymini=relative.tar"])
    assert rc == 2 and "--image" in capsys.readouterr().err
    cl = _cluster(tmp_path, "images:\n  - {name: pymini, path: /x, size: 1}\n")
    rc = main(["replay", "--trace", trace, "--cluster", cl, "--policy", "tangram"])
    assert rc == 2 and "cluster.yaml:6: images[0].size" in capsys.readouterr().err


def test_replay_runs_image_sessions_in_the_image(tmp_path: Path, py_image: str,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    trace = _write(tmp_path / "t.jsonl", TRACE)
    seen: list[str] = []
    payload, stdout = driver.action_payload, driver._stdout

    def tagged(act, model, units, index, in_session):  # the session's actions show their root
        p = payload(act, model, units, index, in_session)
        if in_session:
            p = {**p, "code": "print(open('/etc/os-release').read())\n" + p["code"]}
        return p

    def record(out):
        seen.append(stdout(out))
        return seen[-1]

    monkeypatch.setattr(driver, "action_payload", tagged)
    monkeypatch.setattr(driver, "_stdout", record)
    rc = main(["replay", "--trace", trace, "--cluster", _cluster(tmp_path), "--policy", "tangram",
               "--image", f"pymini={py_image}", "--predict", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rep = out["reports"]["tangram"]
    assert rep["actions"] == 3 and rep["by_status"] == {"succeeded": 3}, rep
    assert rep["session_state_kept"] is True  # turn 2 saw turn 1's state, in the image
    assert len(seen) == 2 and all("ID=tangram-mini" in s for s in seen), seen
    assert out["predicted"]["tangram"]["actions"] == 3


EXAMPLES = Path(__file__).parent.parent.parent / "examples"


def _replay_example(tmp_path: Path, image: str, capsys: pytest.CaptureFixture[str]) -> dict:
    """examples/swe_trace.jsonl replayed under tangram with ``image`` as its swe-example image;
    the policy's report."""
    cl = tmp_path / "cluster.yaml"
    cl.write_text((EXAMPLES / "swe_cluster.yaml").read_text() + "calibration: {units_per_s: 5000}\n")
    rc = main(["replay", "--trace", str(EXAMPLES / "swe_trace.jsonl"), "--cluster", str(cl),
               "--policy", "tangram", "--image", f"swe-example={image}", "--json"])
    assert rc == 0
    return json.loads(capsys.readouterr().out)["reports"]["tangram"]


def test_example_swe_trace_replays_in_an_image(tmp_path: Path, py_image: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """examples/swe_trace.jsonl, its image given by a tiny stand-in with python3 (the real one
    needs mmdebstrap: the slow test below)."""
    rep = _replay_example(tmp_path, py_image, capsys)
    assert rep["actions"] == 9 and rep["by_status"] == {"succeeded": 9}, rep
    assert rep["session_state_kept"] is True


@pytest.mark.slow
def test_example_swe_trace_replays_in_the_debian_swe_image(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    sys.path.insert(0, str(EXAMPLES))
    import swe_image

    try:
        layout = swe_image.build()
    except Exception as e:  # no mmdebstrap, or no access to Debian's mirror
        pytest.skip(f"cannot build the SWE example image here: {e}")
    rep = _replay_example(tmp_path, str(layout), capsys)
    assert rep["by_status"] == {"succeeded": 9} and rep["session_state_kept"] is True, rep
