"""What the sub-commands share: their console, their exit on bad input, the cluster and
calibration they run on, the policy and workload names they check, progress bars, figures.

Invariant: nothing here prints a figure or decides a policy; a bad argument, file or name is
an exception (`SpecError`, `KeyError`) that `exit_on_bad_input` turns into exit code 2 with
``tangram CMD: message``, as every sub-command did on its own before.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..core.errors import SpecError

Say = Callable[[str], None]


def make_console(*, stderr: bool = False, width: int = 160) -> Any:
    """A rich console (on stderr when stdout carries JSON), ``width`` wide when not a terminal."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal:
        console.width = width
    return console


def exit_on_bad_input(command: str, body: Callable[[argparse.Namespace], int],
                      args: argparse.Namespace) -> int:
    """``body(args)``; a `SpecError` or an unknown name (`KeyError`) exits 2 with one line."""
    try:
        return body(args)
    except SpecError as exc:
        print(f"tangram {command}: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"tangram {command}: {exc.args[0]}", file=sys.stderr)
        return 2


def resolve_cluster(path: str | None, say: Say, *, repeats: int = 5,
                    announce: Callable[[], None] | None = None) -> tuple[Any, dict[str, Any]]:
    """(cluster spec, its calibration section): the spec file at ``path``; without one, this
    machine measured now (`tangram calibrate`'s code, ``repeats`` samples per figure, after
    ``announce()``)."""
    from ..replay.calibrate import calibrate, cluster_of, read_calibration
    from ..specfile import load_cluster_yaml

    if path:
        return load_cluster_yaml(path), read_calibration(path)
    if announce is not None:
        announce()
    spec = calibrate(repeats=repeats, say=say)
    return cluster_of(spec), dict(spec["calibration"])


def policy_list(text: str | None) -> list[str] | None:
    """Comma-separated policy labels, each checked (`KeyError` on an unknown one); None: none given."""
    from ..sim import runner

    if not text:
        return None
    labels = [x.strip() for x in text.split(",")]
    for label in labels:
        runner.parse_policy(label)
    return labels


def check_workload(name: str) -> None:
    """`KeyError` naming the built-in workloads when ``name`` is not one."""
    from ..sim.workloads import get_workload

    get_workload(name)


@contextlib.contextmanager
def progress_bars(show: bool) -> Iterator[Callable[[str, int], Callable[[int], None]] | None]:
    """A rich bar per run (`replay.compare.replay_all`'s ``start_run``), or None when not shown."""
    if not show:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), transient=False)
    bar.start()

    def start_run(label: str, total: int) -> Callable[[int], None]:
        tid = bar.add_task(label, total=total)
        return lambda n: bar.advance(tid, n)

    try:
        yield start_run
    finally:
        bar.stop()


def label_axes(ax: Any, xlabel: str, ylabel: str, title: str, *, log_x: bool = False,
               small_legend: bool = True) -> None:
    """A panel's labels, title and legend (and a log x axis)."""
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if small_legend:
        ax.legend(fontsize="small")
    else:
        ax.legend()


def act_cdf_axes(ax: Any, title: str, *, small_legend: bool = False) -> None:
    """The labels of an ACT CDF panel (log seconds against the fraction of actions)."""
    label_axes(ax, "ACT (s)", "fraction of actions", title, log_x=True, small_legend=small_legend)


def save_figure(fig: Any, path: str) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cdf(xs: Sequence[float]) -> tuple[list[float], list[float]]:
    """Sorted values and their cumulative fractions."""
    s = sorted(float(x) for x in xs)
    return s, [(k + 1) / len(s) for k in range(len(s))]
