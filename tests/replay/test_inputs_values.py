"""replay/inputs.py's values (issue 43 item 2: the survivors of `make mutation` on it): which
lines of a trace hold its trajectories (blank and ``#`` lines skipped, numbered from 1), what
"fits a node" means (every dimension within 1e-9 of one node's capacity), and each `SpecError`
a replay's inputs raise before anything runs -- its file, line, field and message word for word,
the first problem in trace order (sessions before steps), no line where none is known -- for
the trace against the cluster, the ``images:`` section of a cluster spec, ``--image NAME=PATH``
and a session's image without a path; then `load_for_replay`'s RL steps and their limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arl_tangram.core.actions import ActionKind, Elasticity
from arl_tangram.core.cluster import ClusterSpec, ModelSpec, NodeSpec
from arl_tangram.core.errors import SpecError
from arl_tangram.core.resources import Resources
from arl_tangram.replay import inputs as I
from arl_tangram.sim.trace import SessionDef, SimAction, Trajectory


def _cluster(*models: str) -> ClusterSpec:
    return ClusterSpec((NodeSpec("small", Resources(cpu=2, memory_mb=1024)),
                        NodeSpec("big", Resources(cpu=4, memory_mb=512, gpu=1))),
                       tuple(ModelSpec(m) for m in models))


def _act(cpu: float = 1, mem: float = 256, model: str | None = None,
         el: Elasticity | None = None, kind: ActionKind = ActionKind.CODE) -> SimAction:
    return SimAction(kind, 1.0, Resources(cpu=cpu, memory_mb=mem), el, model=model)


def _t(*acts: SimAction, sessions: dict[str, SessionDef] | None = None, tid: str = "t") -> Trajectory:
    return Trajectory(tid, "x", tuple((0.0, a) for a in acts), sessions=sessions or {})


def _err(fn: object, *args: object, **kw: object) -> SpecError:
    with pytest.raises(SpecError) as e:
        fn(*args, **kw)  # type: ignore[operator]
    return e.value


def _where(e: SpecError) -> tuple[str, int | None, str, str]:
    return e.file, e.line, e.field, e.message


# ---- trace_lines ------------------------------------------------------------------------------


def test_trace_lines_number_from_one_and_skip_blank_and_comment_lines(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"a": 1}\n\n   \n# a comment\n   # indented comment\n  {"b": 2}  \n{"c": 3}\n'
                 "#\n")
    assert I.trace_lines(p) == [1, 6, 7]
    assert I.trace_lines(str(p)) == [1, 6, 7]
    p.write_text("")
    assert I.trace_lines(p) == []
    p.write_text("x#y\n")  # a "#" not at the start is not a comment
    assert I.trace_lines(p) == [1]


def test_trace_lines_reads_utf8_whatever_the_locale(tmp_path: Path) -> None:
    # as `sim.trace` reads the trace: a non-ASCII comment or task name is numbered the same in
    # an ASCII locale (LC_ALL=C without Python's UTF-8 mode), not a UnicodeDecodeError
    p = tmp_path / "t.jsonl"
    p.write_text('# r\u00e9sum\u00e9 \u2014 a comment\n{"id": "a", "task": "\u00e9t\u00e9"}\n',
                 encoding="utf-8")
    assert I.trace_lines(p) == [2]  # (here too: mutmut maps a test to what it calls in-process)
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
           "PYTHONCOERCECLOCALE": "0"}
    code = "import sys; from arl_tangram.replay.inputs import trace_lines; print(trace_lines(sys.argv[1]))"
    out = subprocess.run([sys.executable, "-c", code, str(p)], env=env, capture_output=True,
                         text=True, encoding="utf-8", timeout=60)
    assert (out.returncode, out.stdout) == (0, "[2]\n"), out.stderr


# ---- check_against ----------------------------------------------------------------------------


def test_a_demand_fits_when_one_node_holds_every_dimension_within_a_billionth() -> None:
    c = _cluster()
    fits = I._fits_somewhere
    assert fits(c, Resources(cpu=4, memory_mb=512))  # big, exactly
    assert fits(c, Resources(cpu=2, memory_mb=1024))  # small, exactly
    assert fits(c, Resources(cpu=4 + 5e-10, memory_mb=512))
    assert fits(c, Resources(cpu=4 + 1e-9, memory_mb=512))  # exactly at the tolerance
    assert not fits(c, Resources(cpu=4 + 2e-9, memory_mb=512))
    # 4 cores (only big has) and 1024 MB (only small has): no one node has both
    assert not fits(c, Resources(cpu=4, memory_mb=1024))
    assert fits(c, Resources(gpu=1)) and not fits(c, Resources(gpu=2))
    assert fits(c, Resources())


def test_a_trace_the_cluster_can_run_passes() -> None:
    c = _cluster("rm")
    el = Elasticity(1, 8)  # its maximum may exceed every node: it is its minimum that must fit
    ok = _t(_act(), _act(4, 512, el=el), _act(0, 0, model="rm", kind=ActionKind.REWARD),
            sessions={"s": SessionDef(Resources(memory_mb=1024))})
    assert I.check_against(c, [ok, ok], "t.jsonl", [1, 2]) is None
    assert I.check_against(c, [], "t.jsonl") is None


def test_an_unknown_model_is_named_with_the_clusters_models() -> None:
    c = _cluster("rm", "judge")
    bad = _t(_act(), _act(0, 0, model="ghost", kind=ActionKind.REWARD))
    e = _err(I.check_against, c, [_t(_act()), bad], "t.jsonl", [3, 7])
    assert _where(e) == ("t.jsonl", 7, "steps[1][1].model",
                         "model 'ghost' is not in the cluster spec (it has: judge, rm)")
    assert str(e) == ("t.jsonl:7: steps[1][1].model: model 'ghost' is not in the cluster spec "
                      "(it has: judge, rm)")
    e = _err(I.check_against, _cluster(), [bad], "t.jsonl", [3])
    assert e.message == "model 'ghost' is not in the cluster spec (it has: none)"


def test_a_demand_no_node_holds_is_named_with_its_amounts() -> None:
    e = _err(I.check_against, _cluster(), [_t(_act(), _act(), _act(4, 1024))], "t.jsonl", [5])
    assert _where(e) == ("t.jsonl", 5, "steps[2][1].demand",
                         "{'cpu': 4.0, 'memory_mb': 1024.0} fits no node of the cluster")


def test_an_elastic_minimum_above_every_node_is_named() -> None:
    el = Elasticity(4.5, 8)
    e = _err(I.check_against, _cluster(), [_t(_act(1, 256, el=el))], "t.jsonl", [2])
    assert _where(e) == ("t.jsonl", 2, "steps[0][1].elasticity.min", "4.5 cpu exceeds every node")
    # at a node's capacity (within a billionth) it fits
    assert I.check_against(_cluster(), [_t(_act(1, 256, el=Elasticity(4 + 5e-10, 8)))],
                           "t.jsonl") is None
    assert I.check_against(_cluster(), [_t(_act(1, 256, el=Elasticity(4 + 1e-9, 8)))],
                           "t.jsonl") is None  # exactly at the tolerance
    e = _err(I.check_against, _cluster(), [_t(_act(1, 256, el=Elasticity(4 + 2e-9, 8)))], "t")
    assert e.field == "steps[0][1].elasticity.min" and e.line is None


def test_a_session_that_fits_no_node_comes_before_the_steps() -> None:
    s = {"repo": SessionDef(Resources(memory_mb=2048))}
    bad = _t(_act(64), sessions=s)  # its step is bad too: the session is named first
    e = _err(I.check_against, _cluster(), [bad], "t.jsonl", [4])
    assert _where(e) == ("t.jsonl", 4, "sessions.repo.demand",
                         "{'memory_mb': 2048.0} fits no node of the cluster")


def test_the_first_bad_trajectory_in_order_is_named_and_a_line_only_where_known() -> None:
    c = _cluster()
    good, bad = _t(_act()), _t(_act(8))
    e = _err(I.check_against, c, [good, bad, _t(_act(), _act(16))], "f", [1, 2, 3])
    assert (e.line, e.field) == (2, "steps[0][1].demand")
    assert _err(I.check_against, c, [good, bad], "f").line is None  # no lines given
    assert _err(I.check_against, c, [good, bad], "f", [1]).line is None  # fewer lines
    assert _err(I.check_against, c, [good, bad], "f", [1, 9]).line == 9
    assert _err(I.check_against, c, [bad], "f", [0]).line == 0


# ---- images -----------------------------------------------------------------------------------


def test_an_image_entry_needs_a_valid_name_and_an_absolute_path() -> None:
    assert I._image_entry("py", "/img/py.tar", "s", 3, "w") == ("py", "/img/py.tar")
    e = _err(I._image_entry, "../etc", "/x", "spec.yaml", 3, "images[0]")
    assert _where(e) == ("spec.yaml", 3, "images[0].name", "must be an image name, got '../etc'")
    e = _err(I._image_entry, None, "/x", "spec.yaml", 3, "images[0]")
    assert e.message == "must be an image name, got None"
    e = _err(I._image_entry, "py", "rel/py.tar", "spec.yaml", 4, "images[1]")
    assert _where(e) == ("spec.yaml", 4, "images[1].path",
                         "must be an absolute path, got 'rel/py.tar'")
    e = _err(I._image_entry, "py", 5, "spec.yaml", None, "images[1]")
    assert _where(e) == ("spec.yaml", None, "images[1].path", "must be an absolute path, got 5")


def _spec(tmp_path: Path, tail: str) -> Path:
    p = tmp_path / "cluster.yaml"
    p.write_text("nodes:\n  - name: local\n    capacity: {cpu: 2, memory_mb: 4096}\n" + tail)
    return p


def test_read_images_gives_the_sections_names_and_paths_in_order(tmp_path: Path) -> None:
    p = _spec(tmp_path, "images:\n  - {name: py, path: /img/py.tar}\n"
                        "  - name: swe\n    path: /img/swe.tar\n")
    got = I.read_images(p)
    assert got == {"py": "/img/py.tar", "swe": "/img/swe.tar"} and list(got) == ["py", "swe"]
    assert I.read_images(str(p)) == got
    assert I.read_images(_spec(tmp_path, "")) == {}
    assert I.read_images(_spec(tmp_path, "images: []\n")) == {}
    p.write_text("- 1\n- 2\n")  # not a mapping at all: no images section
    assert I.read_images(p) == {}


def test_read_images_errors_name_file_line_and_entry(tmp_path: Path) -> None:
    p = _spec(tmp_path, "images: {name: py}\n")
    assert _where(_err(I.read_images, p)) == (str(p), 1, "images", "must be a list of {name, path}")
    p = _spec(tmp_path, "images:\n  - {name: py, path: /x}\n  - /img/swe.tar\n")
    assert _where(_err(I.read_images, p)) == (str(p), None, "images[1]",
                                              "must be a mapping {name, path}")
    p = _spec(tmp_path, "images:\n  - {name: py, path: /x}\n  - {name: a, path: /y, size: 1, z: 2}\n")
    assert _where(_err(I.read_images, p)) == (str(p), 6, "images[1].size", "unknown field")
    p = _spec(tmp_path, "images:\n  - {name: py, path: /x}\n  - {name: a, path: rel}\n")
    assert _where(_err(I.read_images, p)) == (str(p), 6, "images[1].path",
                                              "must be an absolute path, got 'rel'")
    p = _spec(tmp_path, "images:\n  - {path: /x}\n")
    assert _where(_err(I.read_images, p)) == (str(p), 5, "images[0].name",
                                              "must be an image name, got None")


def test_image_arguments_are_name_equals_absolute_path() -> None:
    assert I.parse_image_args([]) == {}
    assert I.parse_image_args(["py=/img/py.tar", "swe=/a=b.tar"]) == {
        "py": "/img/py.tar", "swe": "/a=b.tar"}
    assert I.parse_image_args(["py=/a", "py=/b"]) == {"py": "/b"}
    e = _err(I.parse_image_args, ["py=/a", "swe"])
    assert _where(e) == ("--image", None, "--image", "must be NAME=PATH, got 'swe'")
    assert str(e) == "--image: --image: must be NAME=PATH, got 'swe'"
    e = _err(I.parse_image_args, ["py=rel.tar"])
    assert _where(e) == ("--image", None, "--image.path", "must be an absolute path, got 'rel.tar'")
    e = _err(I.parse_image_args, ["=/a"])
    assert _where(e) == ("--image", None, "--image.name", "must be an image name, got ''")


def _img(image: str | None, tid: str = "t") -> Trajectory:
    return _t(_act(), sessions={"repo": SessionDef(Resources(memory_mb=256), image=image)}, tid=tid)


def test_a_sessions_image_needs_a_path() -> None:
    images = {"py": "/img/py.tar"}
    assert I.check_images([_img(None), _img("py")], images, "t.jsonl", [1, 2]) is None
    e = _err(I.check_images, [_img("py"), _img("swe"), _img("other")], images, "t.jsonl", [1, 4, 5])
    assert _where(e) == ("t.jsonl", 4, "sessions.repo.image",
                         "image 'swe' has no path: give --image swe=PATH or an images: entry in "
                         "the cluster spec")
    assert _err(I.check_images, [_img("swe")], {}, "t.jsonl").line is None
    assert _err(I.check_images, [_img("py"), _img("swe")], images, "t", [1]).line is None
    assert _err(I.check_images, [_img("py"), _img("swe")], images, "t", [1, 0]).line == 0


def test_the_traces_images_are_its_sessions_named_ones() -> None:
    steps = [[_img("py"), _img(None)], [], [_img("swe"), _img("py"), _img("")]]
    assert I.trace_images(steps) == {"py", "swe"}
    assert I.trace_images([]) == set()


# ---- load_for_replay --------------------------------------------------------------------------


def _trace(tmp_path: Path, rows: list[dict | str]) -> str:
    p = tmp_path / "t.jsonl"
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(p)


CODE = [0.0, {"kind": "code", "work_s": 0.5}]


def test_load_for_replay_gives_the_rl_steps_up_to_the_limit(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [{"id": "a", "steps": [CODE]}, "# step 1", {"id": "b", "step": 1,
                              "steps": [CODE]}, {"id": "c", "step": 2, "steps": [CODE]},
                              {"id": "d", "steps": [CODE]}])
    c = _cluster()
    ids = [[t.id for t in b] for b in I.load_for_replay(trace, c)]
    assert ids == [["a", "d"], ["b"], ["c"]]
    assert [[t.id for t in b] for b in I.load_for_replay(trace, c, steps=2)] == [["a", "d"], ["b"]]
    assert [[t.id for t in b] for b in I.load_for_replay(trace, c, steps=1)] == [["a", "d"]]
    assert [[t.id for t in b] for b in I.load_for_replay(trace, c, steps=0)] == ids  # 0: all


def test_load_for_replay_checks_the_trace_with_its_file_lines(tmp_path: Path) -> None:
    trace = _trace(tmp_path, ["# header", {"id": "a", "steps": [CODE]}, "",
                              {"id": "b", "steps": [CODE, [0.0, {"kind": "code", "work_s": 1,
                                                                 "demand": {"cpu": 64}}]]}])
    e = _err(I.load_for_replay, trace, _cluster())
    assert _where(e)[:3] == (trace, 4, "steps[1][1].demand")
    sess = {"id": "s", "sessions": {"repo": {"image": "py"}},
            "steps": [[0.0, {"kind": "tool", "work_s": 0.1, "session": "repo"}]]}
    trace = _trace(tmp_path, [{"id": "a", "steps": [CODE]}, "", sess])
    # images are checked only when given (a service replays with its own)
    assert len(I.load_for_replay(trace, _cluster())) == 1
    assert len(I.load_for_replay(trace, _cluster(), images={"py": "/x"})) == 1
    e = _err(I.load_for_replay, trace, _cluster(), images={})
    assert _where(e)[:3] == (trace, 3, "sessions.repo.image")
