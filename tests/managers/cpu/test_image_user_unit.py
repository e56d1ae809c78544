"""The image's user and shell, as the sandbox's init reads them from the image (issue 26):
`imagebox.resolve_user` (Docker's rules for an OCI ``User``) and `imagebox.shell_argv`
(Entrypoint + Cmd that start a shell), and the user-namespace range's configuration."""

from __future__ import annotations

import pytest

from arl_tangram.managers.cpu import CpuManagerConfig
from arl_tangram.managers.cpu.sandbox.imagebox import resolve_user, shell_argv

PASSWD = ("root:x:0:0:root:/root:/bin/bash\n# a comment\n"
          "app:x:1000:1001:app:/home/app:/bin/sh\nnobody:x:65534:65534::/nonexistent:/bin/sh\n"
          "broken:x:notanumber\n")
GROUP = "root:x:0:\nstaff:x:50:app\nnogroup:x:65534:\n"


@pytest.mark.parametrize(("spec", "want"), [
    ("", (0, 0, "/root")),
    ("root", (0, 0, "/root")),
    ("app", (1000, 1001, "/home/app")),
    ("1000", (1000, 1001, "/home/app")),  # a number that is in passwd: its entry
    ("4242", (4242, 0, "/")),  # a number that is not: gid 0, home /
    ("app:staff", (1000, 50, "/home/app")),
    ("app:7", (1000, 7, "/home/app")),
    ("4242:4243", (4242, 4243, "/")),
    ("nobody", (65534, 65534, "/nonexistent")),
])
def test_resolve_user_as_docker_does(spec: str, want: tuple[int, int, str]) -> None:
    assert resolve_user(spec, PASSWD, GROUP) == want


def test_resolve_user_refuses_names_the_image_lacks() -> None:
    with pytest.raises(ValueError, match="no user 'ghost'"):
        resolve_user("ghost", PASSWD, GROUP)
    with pytest.raises(ValueError, match="no group 'wheel'"):
        resolve_user("app:wheel", PASSWD, GROUP)
    with pytest.raises(ValueError, match="no user 'broken'"):  # a malformed entry is no entry
        resolve_user("broken", PASSWD, GROUP)
    assert resolve_user("", "", "") == (0, 0, "/root")  # an image without /etc/passwd


@pytest.mark.parametrize(("config", "want"), [
    ({}, None),
    ({"Cmd": ["/bin/bash"]}, ["/bin/bash"]),
    ({"Cmd": ["sh", "-l"]}, ["sh", "-l"]),
    ({"Entrypoint": ["/docker-entrypoint.sh"], "Cmd": ["bash"]},
     ["/docker-entrypoint.sh", "bash"]),
    ({"Entrypoint": ["/bin/zsh"]}, ["/bin/zsh"]),
    ({"Cmd": ["/bin/sh", "-c", "sleep 1"]}, None),  # a command, not a shell reading commands
    ({"Cmd": ["bash", "/run.sh"]}, None),  # a script
    ({"Cmd": ["python3"]}, None),  # not a shell
    ({"Entrypoint": ["/bin/bash"], "Cmd": ["-c", "x"]}, None),
])
def test_shell_argv(config: dict[str, list[str]], want: list[str] | None) -> None:
    assert shell_argv(config) == want


def test_id_range_is_validated() -> None:
    CpuManagerConfig(image_id_base=1 << 20, image_id_count=65536)
    for bad in ({"image_id_base": 1000}, {"image_id_base": (1 << 32) - 65536},
                {"image_id_base": 1 << 20, "sandbox_uid": (1 << 20) + 5},
                {"image_id_count": 0}, {"image_id_base": True}):
        with pytest.raises(ValueError, match="image_id"):
            CpuManagerConfig(**bad)  # type: ignore[arg-type]
