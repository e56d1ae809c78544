"""scripts/mutation.py's patches of its copy (issue 43): the fork server and the reaper, run as
`python -m ...zygote.server` / `...reaper.server`, define their functions in `__main__`; mutmut's
trampolines then never ran their mutants. The copy's servers take their own module names first
(`_server_as_its_module`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts/mutation.py")
assert _spec is not None and _spec.loader is not None
ms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ms)

_ZYGOTE = "arl_tangram.managers.cpu.zygote.server"


def _module(tmp_path: Path, text: str, module: str = _ZYGOTE) -> Path:
    pkg = tmp_path / module.rsplit(".", 1)[0].replace(".", "/")
    pkg.mkdir(parents=True)
    for d in (
        tmp_path / "arl_tangram",
        tmp_path / "arl_tangram/managers",
        tmp_path / "arl_tangram/managers/cpu",
        pkg,
    ):
        (d / "__init__.py").write_text("")
    (pkg / "server.py").write_text(text)
    return pkg / "server.py"


def test_the_fork_servers_functions_carry_its_module_name_when_run_as_main(tmp_path: Path) -> None:
    p = _module(
        tmp_path,
        '"""doc"""\n\nfrom __future__ import annotations\n\nimport sys\n\n\n'
        "def f() -> str:\n    return f.__module__\n\n\n"
        'if __name__ == "__main__":\n'
        "    print(f(), sys.modules[f.__module__] is sys.modules['__main__'])\n",
    )
    ms._server_as_its_module(p, _ZYGOTE)
    text = p.read_text()
    assert text.count("if _RUN_AS_MAIN:") == 2 and 'if __name__ == "__main__":' not in text
    out = subprocess.run(
        [sys.executable, "-m", "arl_tangram.managers.cpu.zygote.server"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout == "arl_tangram.managers.cpu.zygote.server True\n"
    # imported, not run: nothing runs, the name is its own
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import arl_tangram.managers.cpu.zygote.server as s; print(s.f(), s._RUN_AS_MAIN)",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout == "arl_tangram.managers.cpu.zygote.server False\n"


@pytest.mark.parametrize(
    ("module", "tail"),
    [
        (
            _ZYGOTE,
            "    _ = proc  # imported for the sandbox's use after pivot_root\n    bind_now()\n    main()\n",
        ),
        ("arl_tangram.managers.cpu.reaper.server", "    main()\n"),
    ],
)
def test_the_real_servers_take_the_patch(tmp_path: Path, module: str, tail: str) -> None:
    assert module in ms.SERVERS and len(ms.SERVERS) == 2
    p = _module(tmp_path, (ROOT / "src" / (module.replace(".", "/") + ".py")).read_text(), module)
    ms._server_as_its_module(p, module)
    text = p.read_text()
    compile(text, str(p), "exec")
    assert text.index("_RUN_AS_MAIN = ") < text.index("\ndef ")
    assert f'    __name__ = "{module}"\n' in text
    assert text.count("\nif _RUN_AS_MAIN:") == 2 and text.endswith("\nif _RUN_AS_MAIN:\n" + tail)


def test_a_server_without_its_entry_point_is_refused(tmp_path: Path) -> None:
    p = _module(tmp_path, "from __future__ import annotations\n\nx = 1\n")
    with pytest.raises(SystemExit) as e:
        ms._server_as_its_module(p, _ZYGOTE)
    assert (
        str(e.value)
        == f"{p}: no __future__ import or entry point to patch (its mutants would not run)"
    )
